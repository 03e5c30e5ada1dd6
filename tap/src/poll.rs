//! The poll loop of a store tap: poll, find new keys, report their stamps, count.
//!
//! Every poll asks for the rows at or after the newest row time seen less the store's
//! overlap (VictoriaMetrics: the last `lookback` before now). Keys already reported are
//! dropped by a bounded set that forgets keys older than the poll's window. The first
//! successful poll is the *baseline*: the rows already in the store when the tap started
//! belong to no message of this run and are not reported. For each new key:
//!
//! - `query_start` = the poll's send time, `queryable` = its response time (both this host's
//!   CLOCK_REALTIME), through an exporter announcing this host;
//! - `store_in` = the row's time, through a second exporter announcing the store's host,
//!   whose clock status is this host's when the store runs here and unknown otherwise;
//! - the *poll bracket*, this poll's response minus the previous successful poll's send:
//!   the data became visible within it, so `queryable` is late by at most that much.
//!
//! A store that is down or restarting is polled again with backoff; its errors are counted
//! and logged once per kind, and polling resumes where it left off. A store that cannot be
//! reached at start is waited for up to [`StoreTapConfig::wait_for_store`], then the tap
//! does not start. A table or measurement that disappears mid-run (dropped) does not stop
//! the tap either: rows written while it is gone cannot be found, so their traces end
//! incomplete, missing `queryable`; the tap logs that as an error once, counts every
//! failed poll and polls on, so a table created again is found again. (InfluxDB answers a
//! dropped measurement like an empty one: there the tap cannot tell.) A key that does not
//! decode is counted (`bad_keys`) and skipped. The counters below go to the collector in
//! Counters frames of the first exporter (ids from 64, `docs/collector-protocol.md`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use hoptrace_probe::clock::{ClockStatus, Leap, realtime_ns};
use hoptrace_probe::{
    ClockReporting, CounterSnapshot, Exporter, ExporterConfig, HopId, Probe, TraceContext, TraceKey,
};
use hoptrace_protocol::CountersFrame;
use rustc_hash::FxHashSet;

use crate::store::{self, Store, StoreError, StoreUrl, UrlError};

/// Counter ids a store tap adds to its Counters frames (`docs/collector-protocol.md`).
pub mod counter_id {
    /// Polls sent (answered or not).
    pub const POLLS: u16 = 64;
    /// Polls that failed (unreachable store, query error, unexpected answer).
    pub const POLL_ERRORS: u16 = 65;
    /// New keys reported (each once).
    pub const KEYS_FOUND: u16 = 66;
    /// Key values that did not decode as a trace context.
    pub const BAD_KEYS: u16 = 67;
    /// Rows returned with a key (new, repeated or bad).
    pub const ROWS: u16 = 68;
    /// Rows of keys already reported or already present at start (the overlap re-reads
    /// them; a JSON batch stores one row per metric).
    pub const ROWS_REPEATED: u16 = 69;
    /// Rows without a key (data of untraced messages).
    pub const UNTRACED_ROWS: u16 = 70;
    /// Keys present when the tap started (not reported).
    pub const BASELINE_KEYS: u16 = 71;
    /// Keys of publishers not asked for (not reported).
    pub const FOREIGN_KEYS: u16 = 72;
    /// Sum over the keys found of their poll bracket, ns.
    pub const BRACKET_SUM_NS: u16 = 73;
    /// Largest poll bracket of a key found, ns.
    pub const BRACKET_MAX_NS: u16 = 74;
    /// P50 of the keys' poll brackets (HDR, 3 digits), ns.
    pub const BRACKET_P50_NS: u16 = 75;
    /// P99 of the keys' poll brackets (HDR, 3 digits), ns.
    pub const BRACKET_P99_NS: u16 = 76;
    /// Sum over the answered polls of response − send, ns.
    pub const QUERY_TIME_SUM_NS: u16 = 77;
    /// Polls answered (the denominator of the query time's mean).
    pub const POLLS_ANSWERED: u16 = 78;
    /// Sum of the query durations the store itself reported, ns.
    pub const SERVER_ELAPSED_SUM_NS: u16 = 79;
    /// Polls whose answer carried the store's own query duration.
    pub const SERVER_ELAPSED_POLLS: u16 = 80;
    /// Polls that found at least one new key.
    pub const POLLS_WITH_KEYS: u16 = 81;
    /// The configured poll interval, ns.
    pub const POLL_INTERVAL_NS: u16 = 82;
    /// Hop id of the stamp the bracket bounds (`queryable`).
    pub const BRACKET_HOP: u16 = 83;
    /// Keys forgotten before their window passed because the set was full (they may be
    /// reported twice: the collector then counts a late record).
    pub const KEYS_EVICTED_EARLY: u16 = 84;
    /// P99 of the polls' query time (response − send), ns.
    pub const QUERY_TIME_P99_NS: u16 = 85;
    /// P50 of the polls' query time (HDR, 3 digits), ns.
    pub const QUERY_TIME_P50_NS: u16 = 86;
    /// Largest query time of a poll, ns.
    pub const QUERY_TIME_MAX_NS: u16 = 87;
    /// P50 of the query durations the store itself reported (HDR, 3 digits), ns.
    pub const SERVER_ELAPSED_P50_NS: u16 = 88;
    /// P99 of the query durations the store itself reported (HDR, 3 digits), ns.
    pub const SERVER_ELAPSED_P99_NS: u16 = 89;
    /// Largest query duration the store itself reported, ns.
    pub const SERVER_ELAPSED_MAX_NS: u16 = 90;
    /// Time since the tap began polling, ns (polls per second = polls / this).
    pub const POLLING_NS: u16 = 91;

    /// The counter's name, or `None` for an id outside this list.
    #[must_use]
    pub fn name(id: u16) -> Option<&'static str> {
        Some(match id {
            POLLS => "polls",
            POLL_ERRORS => "poll_errors",
            KEYS_FOUND => "keys_found",
            BAD_KEYS => "bad_keys",
            ROWS => "rows",
            ROWS_REPEATED => "rows_repeated",
            UNTRACED_ROWS => "untraced_rows",
            BASELINE_KEYS => "baseline_keys",
            FOREIGN_KEYS => "foreign_keys",
            BRACKET_SUM_NS => "bracket_sum_ns",
            BRACKET_MAX_NS => "bracket_max_ns",
            BRACKET_P50_NS => "bracket_p50_ns",
            BRACKET_P99_NS => "bracket_p99_ns",
            QUERY_TIME_SUM_NS => "query_time_sum_ns",
            POLLS_ANSWERED => "polls_answered",
            SERVER_ELAPSED_SUM_NS => "server_elapsed_sum_ns",
            SERVER_ELAPSED_POLLS => "server_elapsed_polls",
            POLLS_WITH_KEYS => "polls_with_keys",
            POLL_INTERVAL_NS => "poll_interval_ns",
            BRACKET_HOP => "bracket_hop",
            KEYS_EVICTED_EARLY => "keys_evicted_early",
            QUERY_TIME_P99_NS => "query_time_p99_ns",
            QUERY_TIME_P50_NS => "query_time_p50_ns",
            QUERY_TIME_MAX_NS => "query_time_max_ns",
            SERVER_ELAPSED_P50_NS => "server_elapsed_p50_ns",
            SERVER_ELAPSED_P99_NS => "server_elapsed_p99_ns",
            SERVER_ELAPSED_MAX_NS => "server_elapsed_max_ns",
            POLLING_NS => "polling_ns",
            _ => return None,
        })
    }
}

/// What to poll, how often, and what to report.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreTapConfig {
    /// The store.
    pub url: StoreUrl,
    /// The collector and how to reach it; without it the tap only polls and counts. The
    /// tap connects at start and waits for the Welcome (up to its `welcome_timeout`); the
    /// `store_in` exporter announces the same process name with ` (store clock)` added.
    pub collector: Option<ExporterConfig>,
    /// The hop of the response stamp (default 5 `queryable`).
    pub queryable_hop: (HopId, String),
    /// The hop of the send stamp (default 4 `query_start`); `None`: not reported.
    pub query_start_hop: Option<(HopId, String)>,
    /// The hop of the row's own time (default 3 `store_in`); `None`: not reported.
    pub store_in_hop: Option<(HopId, String)>,
    /// The store's host name for the `store_in` exporter's Hello (default: the address's
    /// host, or this host's name when that is a loopback address).
    pub store_host: Option<String>,
    /// Time from one poll's send to the next one's (a slow poll is followed at once).
    pub poll_interval: Duration,
    /// Only these publishers' keys are reported; others are counted.
    pub publishers: Option<Vec<u16>>,
    /// Hop id of the publish stamp in the contexts, for the local publish → queryable
    /// figure of the summary.
    pub publish_hop: HopId,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Stop after this many keys found.
    pub max_keys: Option<u64>,
    /// Most keys remembered for de-duplication.
    pub dedup_capacity: usize,
    /// How often the counters go to the collector.
    pub counters_interval: Duration,
    /// How long [`StoreTap::start`] waits for a store that cannot be reached (down, still
    /// starting) before it gives up; zero: it gives up at once.
    pub wait_for_store: Duration,
}

impl StoreTapConfig {
    /// A tap of `url` with the default pipeline's hops and a 10 ms poll interval.
    #[must_use]
    pub fn new(url: StoreUrl) -> Self {
        let store_in = url.kind.store_in_by_default();
        Self {
            url,
            collector: None,
            queryable_hop: (HopId(5), "queryable".into()),
            query_start_hop: Some((HopId(4), "query_start".into())),
            store_in_hop: store_in.then(|| (HopId(3), "store_in".into())),
            store_host: None,
            poll_interval: Duration::from_millis(10),
            publishers: None,
            publish_hop: HopId(0),
            duration: None,
            max_keys: None,
            dedup_capacity: 1 << 20,
            counters_interval: Duration::from_secs(1),
            wait_for_store: Duration::ZERO,
        }
    }
}

/// Why a store tap could not start.
#[derive(Debug, thiserror::Error)]
pub enum StoreTapError {
    /// The address is wrong or incomplete.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// The store refused at start: a missing table, measurement or column, a failing
    /// query.
    #[error("{0}")]
    Store(StoreError),
    /// The store could not be reached at start, for as long as the tap was told to wait:
    /// start it (or check the address), or wait longer (`--wait-for-store 30s`).
    #[error(
        "the store did not answer{}: {detail} (is it running at that address?{})",
        if *wait_ms > 0 { format!(" within {waited_ms} ms") } else { String::new() },
        if *wait_ms > 0 {
            " It did not come up in the time --wait-for-store gave it"
        } else {
            " `--wait-for-store 30s` waits for a store that is still starting"
        }
    )]
    StoreDown {
        /// How long the tap waited, ms.
        waited_ms: u64,
        /// How long it was told to wait (`--wait-for-store`), ms.
        wait_ms: u64,
        /// The last error.
        detail: String,
    },
    /// An exporter could not start (fix a hop or the TLS setting), or the collector did not
    /// welcome it (is `hoptrace collect` running there, with a pipeline that declares these
    /// hops, and the same token?).
    #[error("exporter: {0}")]
    Exporter(#[from] hoptrace_probe::ExporterError),
}

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
    /// The keys' poll brackets: the `queryable` stamp's measurement uncertainty.
    pub bracket: Spread,
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

impl StoreTapSummary {
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

/// Keys reported recently, forgotten once older than the poll window.
struct Seen<K> {
    set: FxHashSet<K>,
    order: VecDeque<(i64, K)>,
    capacity: usize,
    evicted_early: u64,
}

impl<K: std::hash::Hash + Eq + Copy> Seen<K> {
    fn new(capacity: usize) -> Self {
        Self {
            set: FxHashSet::default(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
            evicted_early: 0,
        }
    }

    /// Remembers `key`; false when it was already there.
    fn insert(&mut self, key: K, time_ns: i64) -> bool {
        if !self.set.insert(key) {
            return false;
        }
        self.order.push_back((time_ns, key));
        while self.order.len() > self.capacity {
            if let Some((_, k)) = self.order.pop_front() {
                self.set.remove(&k);
                self.evicted_early += 1;
            }
        }
        true
    }

    /// Forgets keys whose row time is before `cutoff_ns` (no later poll returns them).
    fn forget_before(&mut self, cutoff_ns: i64) {
        while let Some(&(t, k)) = self.order.front() {
            if t >= cutoff_ns {
                break;
            }
            self.order.pop_front();
            self.set.remove(&k);
        }
    }
}

struct Hist {
    h: Histogram<u64>,
    sum: u128,
    max: u64,
}

impl Hist {
    fn new() -> Self {
        Self {
            h: Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds"),
            sum: 0,
            max: 0,
        }
    }

    fn record(&mut self, v: i64) {
        let v = u64::try_from(v).unwrap_or(0);
        self.h.saturating_record(v.max(1));
        self.sum += u128::from(v);
        self.max = self.max.max(v);
    }

    fn spread(&self) -> Spread {
        let n = self.h.len();
        if n == 0 {
            return Spread::default();
        }
        // An HDR value is the top of its bucket: never above the exact maximum.
        Spread {
            count: n,
            mean_ns: self.sum as f64 / n as f64,
            p50_ns: self.h.value_at_quantile(0.5).min(self.max),
            p99_ns: self.h.value_at_quantile(0.99).min(self.max),
            max_ns: self.max,
        }
    }
}

/// A store tap, connected and ready to poll.
pub struct StoreTap {
    config: StoreTapConfig,
    store: Box<dyn Store>,
    newest_ns: Option<i64>,
    notice: Option<String>,
    main: Option<Exporter>,
    store_exporter: Option<Exporter>,
    queryable: Option<Probe>,
    query_start: Option<Probe>,
    store_in: Option<Probe>,
    store_host: String,
    live: Arc<StoreTapLive>,
}

impl std::fmt::Debug for StoreTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreTap")
            .field("store", &self.store.describe())
            .finish_non_exhaustive()
    }
}

/// Opens the store, retrying an unreachable one for up to `wait` (backing off from 100 ms
/// to 1 s) and saying once that it waits.
fn open_waiting(store: &mut dyn Store, wait: Duration) -> Result<store::Opened, StoreTapError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(100);
    let mut said = false;
    loop {
        match store.open() {
            Ok(o) => {
                if said {
                    tracing::info!(
                        "the store answers after {:.1} s",
                        started.elapsed().as_secs_f64()
                    );
                }
                return Ok(o);
            }
            Err(StoreError::Unreachable(detail)) => {
                let waited = started.elapsed();
                if waited >= wait {
                    return Err(StoreTapError::StoreDown {
                        waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                        wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                        detail,
                    });
                }
                if !said {
                    tracing::warn!(
                        "the store does not answer ({detail}); waiting up to {wait:?} for it (--wait-for-store)"
                    );
                    said = true;
                }
                std::thread::sleep(pause.min(wait - waited));
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(StoreTapError::Store(e)),
        }
    }
}

/// A clock status that says nothing: the store host's clock is read through its row times
/// and its synchronisation is not known here.
fn unknown_clock(host: &str) -> ClockReporting {
    ClockReporting::Fixed(ClockStatus {
        leap: Leap::Unsynchronised,
        detail: format!(
            "clock of {host}, read through the store's row times; its status is not known to the tap"
        ),
        ..ClockStatus::default()
    })
}

impl StoreTap {
    /// Opens the store (a missing table, measurement or column stops here), and connects
    /// the exporters to the collector.
    ///
    /// # Errors
    /// [`StoreTapError`] saying what to fix.
    pub fn start(config: StoreTapConfig) -> Result<Self, StoreTapError> {
        let mut store = store::connect(&config.url)?;
        let opened = open_waiting(store.as_mut(), config.wait_for_store)?;
        if let Some(n) = &opened.notice {
            tracing::warn!("{n}");
        }
        let this_host = hoptrace_clock::hostname();
        let store_host = match &config.store_host {
            Some(h) => h.clone(),
            None if config.url.is_loopback() => this_host.clone(),
            None => config.url.host.clone(),
        };
        let mut tap = Self {
            store,
            newest_ns: opened.newest_ns,
            notice: opened.notice,
            main: None,
            store_exporter: None,
            queryable: None,
            query_start: None,
            store_in: None,
            store_host,
            live: Arc::new(StoreTapLive::default()),
            config,
        };
        let Some(exporter) = tap.config.collector.clone() else {
            return Ok(tap);
        };
        let mut hops: Vec<(HopId, &str)> = Vec::new();
        if let Some((h, n)) = &tap.config.query_start_hop {
            hops.push((*h, n));
        }
        hops.push((tap.config.queryable_hop.0, &tap.config.queryable_hop.1));
        let main = Exporter::connect(exporter.clone(), &hops)?;
        tap.queryable = Some(main.probe(tap.config.queryable_hop.0)?);
        if let Some((h, _)) = &tap.config.query_start_hop {
            tap.query_start = Some(main.probe(*h)?);
        }
        tap.main = Some(main);
        if let Some((h, n)) = tap.config.store_in_hop.clone() {
            let mut c = exporter.clone();
            c.process = format!("{} (store clock)", exporter.process);
            c.host.clone_from(&tap.store_host);
            if tap.store_host != this_host {
                c.clock = unknown_clock(&tap.store_host);
            }
            let e = Exporter::connect(c, &[(h, n.as_str())])?;
            tap.store_in = Some(e.probe(h)?);
            tap.store_exporter = Some(e);
        }
        Ok(tap)
    }

    /// One line: the store, what is polled and the hops reported.
    #[must_use]
    pub fn describe(&self) -> String {
        let mut hops = Vec::new();
        if let Some((_, n)) = &self.config.query_start_hop {
            hops.push(n.clone());
        }
        hops.push(self.config.queryable_hop.1.clone());
        if let Some((_, n)) = &self.config.store_in_hop {
            hops.push(format!("{n} (row time, host {})", self.store_host));
        }
        format!(
            "{} every {:?}{}",
            self.store.describe(),
            self.config.poll_interval,
            if self.main.is_some() {
                format!(", reporting {}", hops.join(", "))
            } else {
                ", not reporting (no collector)".into()
            }
        )
    }

    /// Live counts.
    #[must_use]
    pub fn live(&self) -> Arc<StoreTapLive> {
        Arc::clone(&self.live)
    }

    /// Polls until `shutdown` is set, the duration passes or `max_keys` keys were found;
    /// then sends the final counters and closes the exporters.
    #[must_use]
    pub fn run(mut self, shutdown: &AtomicBool) -> StoreTapSummary {
        let started = Instant::now();
        let deadline = self.config.duration.map(|d| started + d);
        let interval = self.config.poll_interval;
        let resolution = i64::try_from(self.store.time_resolution_ns()).unwrap_or(1);
        let mut seen: Seen<TraceKey> = Seen::new(self.config.dedup_capacity);
        // Rows whose key does not decode, by a hash of the text: counted once each.
        let mut seen_bad: Seen<u64> = Seen::new(self.config.dedup_capacity);
        let mut query_time = Hist::new();
        let mut server_elapsed = Hist::new();
        let mut bracket = Hist::new();
        let mut to_queryable = Hist::new();
        let mut to_store = Hist::new();
        let mut c = Tally::default();
        let mut baseline = true;
        let mut prev_send: Option<i64> = None;
        let mut next_poll = Instant::now();
        let mut next_counters = Instant::now() + self.config.counters_interval;
        let mut backoff = Duration::ZERO;
        let mut error_streak = 0u64;
        let mut last_error: Option<String> = None;
        let mut sample_failed = false;
        let mut refused: Option<String> = None;
        let live = Arc::clone(&self.live);
        while !shutdown.load(Relaxed)
            && deadline.is_none_or(|d| Instant::now() < d)
            && self.config.max_keys.is_none_or(|m| c.keys_found < m)
        {
            let now = Instant::now();
            if now >= next_counters {
                next_counters = now + self.config.counters_interval;
                if let Some(r) = [&self.main, &self.store_exporter]
                    .into_iter()
                    .flatten()
                    .find_map(Exporter::rejected)
                {
                    tracing::error!(
                        "polling stopped: the collector refused the tap's probe for good: {r}"
                    );
                    refused = Some(r);
                    break;
                }
                self.send_counters(
                    &c,
                    &hists(&bracket, &query_time, &server_elapsed),
                    seen.evicted_early,
                    started,
                );
            }
            if now < next_poll {
                std::thread::sleep((next_poll - now).min(Duration::from_millis(50)));
                continue;
            }
            let send_ns = realtime_ns();
            let since = self.store.since(self.newest_ns, send_ns);
            let result = self.store.poll(since);
            let resp_ns = realtime_ns();
            c.polls += 1;
            live.polls.fetch_add(1, Relaxed);
            let batch = match result {
                Ok(b) => b,
                Err(e) => {
                    c.poll_errors += 1;
                    live.poll_errors.fetch_add(1, Relaxed);
                    error_streak += 1;
                    let msg = e.to_string();
                    if last_error.as_deref() != Some(msg.as_str()) {
                        if matches!(e, StoreError::Missing(_)) {
                            // Data written while it is gone cannot be found: their traces
                            // will miss this hop. A table created again is polled again.
                            tracing::error!(
                                "poll failed: {msg}: what the tap polls is gone, so rows written now are not found (their traces will miss {}); polling on with backoff in case it is created again, each failed poll counted",
                                self.config.queryable_hop.1
                            );
                        } else {
                            tracing::warn!(
                                "poll failed: {msg} (polling on with backoff; errors are counted)"
                            );
                        }
                    }
                    last_error = Some(msg);
                    backoff = (backoff * 2).clamp(
                        interval.max(Duration::from_millis(50)),
                        Duration::from_secs(2),
                    );
                    next_poll = Instant::now() + backoff;
                    continue;
                }
            };
            if error_streak > 0 {
                tracing::info!("the store answers again after {error_streak} failed polls");
                error_streak = 0;
            }
            backoff = Duration::ZERO;
            next_poll = now + interval;
            c.answered += 1;
            query_time.record(resp_ns - send_ns);
            if let Some(s) = batch.server_elapsed_ns {
                server_elapsed.record(i64::try_from(s).unwrap_or(i64::MAX));
                c.server_elapsed_sum = c.server_elapsed_sum.saturating_add(s);
                c.server_elapsed_polls += 1;
            }
            c.untraced_rows += batch.untraced;
            let mut found_here = 0u64;
            for row in &batch.rows {
                c.rows += 1;
                self.newest_ns = Some(self.newest_ns.map_or(row.time_ns, |n| n.max(row.time_ns)));
                let ctx = match TraceContext::decode_text(&row.key) {
                    Ok(ctx) => ctx,
                    Err(e) => {
                        let h = std::hash::BuildHasher::hash_one(
                            &rustc_hash::FxBuildHasher,
                            (row.key.as_str(), row.time_ns),
                        );
                        if !seen_bad.insert(h, row.time_ns) {
                            c.rows_repeated += 1;
                            continue;
                        }
                        if baseline {
                            c.baseline_keys += 1;
                            continue;
                        }
                        if c.bad_keys == 0 {
                            tracing::warn!(
                                "a row's key {:?} is not a trace context: {e} (further ones are counted as bad_keys)",
                                crate::store::clip(&row.key, 60)
                            );
                        }
                        c.bad_keys += 1;
                        live.bad_keys.fetch_add(1, Relaxed);
                        continue;
                    }
                };
                if !seen.insert(ctx.key, row.time_ns) {
                    c.rows_repeated += 1;
                    continue;
                }
                if baseline {
                    c.baseline_keys += 1;
                    continue;
                }
                if self
                    .config
                    .publishers
                    .as_ref()
                    .is_some_and(|p| !p.contains(&ctx.key.publisher))
                {
                    c.foreign_keys += 1;
                    continue;
                }
                // A full exporter queue is counted by the probe and reported.
                if let Some(p) = &self.query_start {
                    p.report_stamp(&ctx, send_ns);
                }
                if let Some(p) = &self.queryable {
                    p.report_stamp(&ctx, resp_ns);
                }
                if let Some(p) = &self.store_in {
                    p.report_stamp(&ctx, row.time_ns);
                }
                if let Some(prev) = prev_send {
                    bracket.record(resp_ns - prev);
                }
                if let Some(s) = ctx.stamp_of(self.config.publish_hop) {
                    to_queryable.record(resp_ns - s.ns);
                    if self.config.store_in_hop.is_some() {
                        to_store.record(row.time_ns - s.ns);
                    }
                }
                found_here += 1;
            }
            if found_here > 0 {
                c.keys_found += found_here;
                c.polls_with_keys += 1;
                live.keys_found.fetch_add(found_here, Relaxed);
            }
            if let Some(s) = since {
                seen.forget_before(s.saturating_sub(resolution));
                seen_bad.forget_before(s.saturating_sub(resolution));
            }
            if baseline && c.baseline_keys > 0 {
                tracing::info!(
                    keys = c.baseline_keys,
                    "keys already in the store at start: not reported"
                );
            }
            if baseline {
                live.baseline_taken.store(true, Relaxed);
            }
            baseline = false;
            prev_send = Some(send_ns);
            match self.store.sample_own_duration() {
                Ok(Some(ns)) => {
                    server_elapsed.record(i64::try_from(ns).unwrap_or(i64::MAX));
                    c.server_elapsed_sum = c.server_elapsed_sum.saturating_add(ns);
                    c.server_elapsed_polls += 1;
                }
                Ok(None) => {}
                Err(e) => {
                    if !sample_failed {
                        tracing::warn!(
                            "sampling the store's own query duration failed: {e} (further failures are not logged)"
                        );
                        sample_failed = true;
                    }
                }
            }
        }
        self.send_counters(
            &c,
            &hists(&bracket, &query_time, &server_elapsed),
            seen.evicted_early,
            started,
        );
        let run_id = self.main.as_ref().and_then(Exporter::run_id);
        let mut exporters = Vec::new();
        self.queryable = None;
        self.query_start = None;
        self.store_in = None;
        for e in [self.main.take(), self.store_exporter.take()]
            .into_iter()
            .flatten()
        {
            let s = e.shutdown_promptly(hoptrace_probe::AWAY_AT_STOP);
            exporters.push((s.counters, s.clean));
        }
        StoreTapSummary {
            source: self.store.describe(),
            query: self.store.query_shape(),
            run_id,
            elapsed_ns: started.elapsed().as_nanos() as u64,
            poll_interval: interval,
            polls: c.polls,
            poll_errors: c.poll_errors,
            last_error,
            query_time: query_time.spread(),
            server_elapsed: (!server_elapsed.h.is_empty()).then(|| server_elapsed.spread()),
            keys_found: c.keys_found,
            polls_with_keys: c.polls_with_keys,
            bad_keys: c.bad_keys,
            rows: c.rows,
            rows_repeated: c.rows_repeated,
            untraced_rows: c.untraced_rows,
            baseline_keys: c.baseline_keys,
            foreign_keys: c.foreign_keys,
            keys_evicted_early: seen.evicted_early,
            bracket: bracket.spread(),
            publish_to_queryable: to_queryable.spread(),
            publish_to_store: self
                .config
                .store_in_hop
                .is_some()
                .then(|| to_store.spread()),
            store_in: self
                .config
                .store_in_hop
                .is_some()
                .then(|| (self.store_host.clone(), self.store.time_resolution_ns())),
            notice: self.notice.take(),
            exporters,
            collector_refused: refused,
        }
    }

    fn send_counters(&self, c: &Tally, h: &Hists<'_>, evicted: u64, started: Instant) {
        use counter_id as id;
        let Some(e) = &self.main else {
            return;
        };
        let b = h.bracket.spread();
        let q = h.query_time.spread();
        let server = h.server_elapsed.spread();
        let sum = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
        let (bracket, query_time) = (h.bracket, h.query_time);
        let values = vec![
            (id::POLLS, c.polls),
            (id::POLL_ERRORS, c.poll_errors),
            (id::KEYS_FOUND, c.keys_found),
            (id::BAD_KEYS, c.bad_keys),
            (id::ROWS, c.rows),
            (id::ROWS_REPEATED, c.rows_repeated),
            (id::UNTRACED_ROWS, c.untraced_rows),
            (id::BASELINE_KEYS, c.baseline_keys),
            (id::FOREIGN_KEYS, c.foreign_keys),
            (id::BRACKET_SUM_NS, sum(bracket.sum)),
            (id::BRACKET_MAX_NS, b.max_ns),
            (id::BRACKET_P50_NS, b.p50_ns),
            (id::BRACKET_P99_NS, b.p99_ns),
            (id::QUERY_TIME_SUM_NS, sum(query_time.sum)),
            (id::POLLS_ANSWERED, c.answered),
            (id::SERVER_ELAPSED_SUM_NS, c.server_elapsed_sum),
            (id::SERVER_ELAPSED_POLLS, c.server_elapsed_polls),
            (id::POLLS_WITH_KEYS, c.polls_with_keys),
            (
                id::POLL_INTERVAL_NS,
                u64::try_from(self.config.poll_interval.as_nanos()).unwrap_or(u64::MAX),
            ),
            (id::BRACKET_HOP, u64::from(self.config.queryable_hop.0.0)),
            (id::KEYS_EVICTED_EARLY, evicted),
            (id::QUERY_TIME_P99_NS, q.p99_ns),
            (id::QUERY_TIME_P50_NS, q.p50_ns),
            (id::QUERY_TIME_MAX_NS, q.max_ns),
            (id::SERVER_ELAPSED_P50_NS, server.p50_ns),
            (id::SERVER_ELAPSED_P99_NS, server.p99_ns),
            (id::SERVER_ELAPSED_MAX_NS, server.max_ns),
            (
                id::POLLING_NS,
                u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX),
            ),
        ];
        if let Err(err) = e.send_counters_frame(CountersFrame {
            at_ns: realtime_ns(),
            values,
        }) {
            tracing::warn!("cannot send the tap's counters: {err}");
        }
    }
}

/// The loop's distributions, for the counters.
struct Hists<'a> {
    bracket: &'a Hist,
    query_time: &'a Hist,
    server_elapsed: &'a Hist,
}

fn hists<'a>(bracket: &'a Hist, query_time: &'a Hist, server_elapsed: &'a Hist) -> Hists<'a> {
    Hists {
        bracket,
        query_time,
        server_elapsed,
    }
}

/// The loop's counts.
#[derive(Debug, Default)]
struct Tally {
    polls: u64,
    answered: u64,
    poll_errors: u64,
    keys_found: u64,
    polls_with_keys: u64,
    bad_keys: u64,
    rows: u64,
    rows_repeated: u64,
    untraced_rows: u64,
    baseline_keys: u64,
    foreign_keys: u64,
    server_elapsed_sum: u64,
    server_elapsed_polls: u64,
}

/// Opens the store, then polls until `shutdown`: [`StoreTap::start`] then [`StoreTap::run`].
///
/// # Errors
/// As [`StoreTap::start`].
pub fn run(
    config: StoreTapConfig,
    shutdown: &AtomicBool,
) -> Result<StoreTapSummary, StoreTapError> {
    Ok(StoreTap::start(config)?.run(shutdown))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sequence: u64) -> TraceKey {
        TraceKey {
            publisher: 1,
            stream: 2,
            sequence,
        }
    }

    #[test]
    fn seen_forgets_old_keys_and_stays_bounded() {
        let mut s: Seen<TraceKey> = Seen::new(3);
        assert!(s.insert(key(1), 10));
        assert!(!s.insert(key(1), 10));
        assert!(s.insert(key(2), 20));
        s.forget_before(15);
        assert!(s.insert(key(1), 30), "forgotten once older than the window");
        assert!(s.insert(key(3), 40));
        assert!(s.insert(key(4), 50));
        assert_eq!(s.set.len(), 3);
        assert_eq!(s.evicted_early, 1);
    }

    #[test]
    fn counter_names_are_unique() {
        let names: FxHashSet<&str> = (64..=91).filter_map(counter_id::name).collect();
        assert_eq!(names.len(), 28);
        assert_eq!(counter_id::name(92), None);
        assert_eq!(counter_id::name(63), None);
    }

    #[test]
    fn spreads() {
        let mut h = Hist::new();
        for v in [1_000, 2_000, 3_000, 1_000_000] {
            h.record(v);
        }
        let s = h.spread();
        assert_eq!(s.count, 4);
        assert_eq!(s.max_ns, 1_000_000);
        assert!((s.mean_ns - 251_500.0).abs() < 1.0);
        assert!(s.p99_ns >= 999_000, "{s:?}");
    }
}
