//! What a store tap reports: live counts and the summary of a run.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use hoptrace_probe::CounterSnapshot;

/// Live counts for a progress line.
#[derive(Debug, Default)]
pub struct StoreTapLive {
    /// Polls sent.
    pub polls: AtomicU64,
    /// Polls that failed.
    pub poll_errors: AtomicU64,
    /// New keys reported.
    pub keys_found: AtomicU64,
    /// Keys that did not decode.
    pub bad_keys: AtomicU64,
    /// The first successful poll has taken the baseline (the rows already in the store):
    /// rows written from now on are reported.
    pub baseline_taken: AtomicBool,
}

/// A distribution's summary, ns.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spread {
    /// Values.
    pub count: u64,
    /// Mean.
    pub mean_ns: f64,
    /// P50 (HDR, 3 digits).
    pub p50_ns: u64,
    /// P99 (HDR, 3 digits).
    pub p99_ns: u64,
    /// Maximum (exact).
    pub max_ns: u64,
}

/// What a store tap did.
#[derive(Debug, Clone)]
pub struct StoreTapSummary {
    /// The store, without credentials.
    pub source: String,
    /// The poll's query.
    pub query: String,
    /// Run id the collector announced.
    pub run_id: Option<String>,
    /// How long the tap ran, ns.
    pub elapsed_ns: u64,
    /// The poll interval.
    pub poll_interval: Duration,
    /// Connections that polled.
    pub pollers: usize,
    /// Polls sent.
    pub polls: u64,
    /// Polls that failed.
    pub poll_errors: u64,
    /// The last poll error, if any.
    pub last_error: Option<String>,
    /// Query time of the answered polls (response − send).
    pub query_time: Spread,
    /// The store's own query duration, where it reports one (mean over those polls).
    pub server_elapsed: Option<Spread>,
    /// New keys reported.
    pub keys_found: u64,
    /// Polls that found a new key.
    pub polls_with_keys: u64,
    /// Keys that did not decode.
    pub bad_keys: u64,
    /// Rows returned with a key.
    pub rows: u64,
    /// Rows of keys already seen.
    pub rows_repeated: u64,
    /// Rows without a key.
    pub untraced_rows: u64,
    /// Keys present at start.
    pub baseline_keys: u64,
    /// Keys of other publishers.
    pub foreign_keys: u64,
    /// Keys forgotten early (set full).
    pub keys_evicted_early: u64,
    /// The keys' bounds: `queryable` minus the earliest instant the data can have become
    /// queryable (the `queryable` stamp's measurement uncertainty).
    pub bracket: Spread,
    /// Keys whose earliest instant was their own store time.
    pub earliest_from_store_time: u64,
    /// Keys no remembered poll covered (earliest instant: their publish stamp).
    pub earliest_fallbacks: u64,
    /// Row times that disagree with the clocks around them: how many were after the
    /// response that returned them and by at most how much (ns), and how many were before
    /// their publish stamp (beyond the row time's resolution) and by at most how much.
    /// From the first of either on, row times no longer bound `queryable` from below.
    pub store_time_disagrees: StoreTimeDisagrees,
    /// Connections to the store found lost and opened again (the polls they failed are
    /// among `poll_errors`; a poll that failed bounds nothing).
    pub reconnections: u64,
    /// New keys whose row time was behind the newest row time seen when their poll was
    /// sent (visible out of time order).
    pub late_rows: u64,
    /// The most one of those was behind, ns.
    pub late_max_ns: u64,
    /// How far behind the newest row time polls looked at the end, ns (the store's
    /// overlap, widened to twice the lateness seen).
    pub look_back_ns: u64,
    /// How far behind the newest row time catch-up polls looked, ns (0: none were sent).
    pub catch_up_ns: u64,
    /// Catch-up polls sent (counted in `polls` too).
    pub catch_up_polls: u64,
    /// Keys only a catch-up poll found (behind what the regular polls looked back).
    pub caught_up_keys: u64,
    /// The most one of those was behind the newest row time seen, ns.
    pub caught_up_late_max_ns: u64,
    /// The longest pause set between a catch-up poll's answer and the next one, ns
    /// (the last may not have passed when the tap stopped): they come every
    /// `catch_up_interval` while they find keys, and slow down, doubling up to half the
    /// catch-up window, while they find none.
    pub catch_up_pace_max_ns: u64,
    /// Rows whose key the same poll had already returned in another row (a message
    /// written as several points or rows): each poll reads them all.
    pub rows_sharing_a_key: u64,
    /// What the store's notifications brought, where the address listens (`notify=`).
    pub listen: Option<Listened>,
    /// Series polled by value at the end, resolutions of them, and failed resolutions
    /// (`None`: the address resolves no series).
    pub series: Option<(u64, u64, u64)>,
    /// This host's queryable stamp minus the context's publish stamp, for keys that carry
    /// one (clocks of two hosts when the publisher runs elsewhere).
    pub publish_to_queryable: Spread,
    /// Row time minus the publish stamp (store clock against the publisher's), when
    /// `store_in` is reported.
    pub publish_to_store: Option<Spread>,
    /// Whether `store_in` stamps were reported, the host they were announced as, and the
    /// resolution of the row times, ns.
    pub store_in: Option<(String, u64)>,
    /// A notice from the store at start (e.g. a measurement that does not exist yet).
    pub notice: Option<String>,
    /// The exporters' final counters (tap host, then store host) and whether they closed
    /// cleanly.
    pub exporters: Vec<(CounterSnapshot, bool)>,
    /// The collector refused one of the tap's probes for good during the run (its
    /// reason): the tap stopped there.
    pub collector_refused: Option<String>,
}

/// Rows per new key in the answers that found them (1: one row per message), from the
/// keys found and the rows of a key its own answer had already returned.
pub(super) fn rows_per_key(keys_found: u64, rows_sharing_a_key: u64) -> f64 {
    if keys_found == 0 {
        1.0
    } else {
        (keys_found + rows_sharing_a_key) as f64 / keys_found as f64
    }
}

impl StoreTapSummary {
    /// Rows per new key in the polls that found them (1: one row per message).
    #[must_use]
    pub fn rows_per_key(&self) -> f64 {
        rows_per_key(self.keys_found, self.rows_sharing_a_key)
    }

    /// Polls per second over the run.
    #[must_use]
    pub fn polls_per_s(&self) -> f64 {
        if self.elapsed_ns == 0 {
            0.0
        } else {
            self.polls as f64 / (self.elapsed_ns as f64 / 1e9)
        }
    }
}

/// Row times that cannot be on the tap's clock: after the response that returned them,
/// or before the message was published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreTimeDisagrees {
    /// Rows whose time was after the response that returned them.
    pub ahead: u64,
    /// The most one of those was after it, ns.
    pub ahead_max_ns: u64,
    /// Rows whose time was before their publish stamp by more than the row time's
    /// resolution.
    pub behind: u64,
    /// The most one of those was before it, ns.
    pub behind_max_ns: u64,
}

impl StoreTimeDisagrees {
    /// Whether no row time has disagreed yet (row times may bound `queryable` from below).
    #[must_use]
    pub fn trusted(&self) -> bool {
        self.ahead == 0 && self.behind == 0
    }

    /// Counts a row time `row_ns` returned by a response at `resp_ns`, of a message
    /// published at `publish_ns`, when it cannot be on the tap's clock; says how.
    pub(super) fn check(
        &mut self,
        row_ns: i64,
        resp_ns: i64,
        publish_ns: Option<i64>,
        resolution_ns: i64,
    ) -> Option<String> {
        let ms = |ns: u64| ns as f64 / 1e6;
        if row_ns > resp_ns {
            let by = row_ns.abs_diff(resp_ns);
            self.ahead += 1;
            self.ahead_max_ns = self.ahead_max_ns.max(by);
            return Some(format!(
                "a row's time is {:.1} ms after the response that returned it",
                ms(by)
            ));
        }
        let p = publish_ns?;
        if row_ns < p.saturating_sub(resolution_ns) {
            let by = row_ns.abs_diff(p);
            self.behind += 1;
            self.behind_max_ns = self.behind_max_ns.max(by);
            return Some(format!(
                "a row's time is {:.1} ms before its message was published",
                ms(by)
            ));
        }
        None
    }
}

/// What a tap's listener took from the store: PostgreSQL `LISTEN`, or the writes an
/// InfluxDB subscription sent (then `subscription` is set, a notification is a point of
/// the measurement with a key, and a key notified is one the query it triggered found).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listened {
    /// The channel listened on (or the subscription's name).
    pub channel: String,
    /// Notifications received.
    pub notifications: u64,
    /// Keys a notification reported before any poll found them: their `queryable` is the
    /// notification's arrival and their `query_start` the same instant (no query).
    pub keys_notified: u64,
    /// Notifications whose payload was not `KEY TIME_US`.
    pub bad: u64,
    /// Listener connections that failed to open or were lost (a subscription: requests
    /// that were not HTTP, and triggered queries that failed).
    pub errors: u64,
    /// What an InfluxDB subscription brought, where the address has `subscribe=`.
    pub subscription: Option<Subscribed>,
}

/// An InfluxDB subscription's own counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subscribed {
    /// The retention policy subscribed to.
    pub retention_policy: String,
    /// Where InfluxDB sends (`http://HOST:PORT`).
    pub destination: String,
    /// Write requests received.
    pub writes: u64,
    /// Queries the writes triggered.
    pub queries: u64,
    /// Keys no triggered query found within the retries (left to the polls).
    pub unconfirmed: u64,
    /// Writes InfluxDB could not deliver to the tap (its `writeFailures` of the
    /// subscription).
    pub delivery_failures: u64,
}
