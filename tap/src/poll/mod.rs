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
//! - the earliest instant the data can have become visible (the `bounds` module), reported
//!   as the spec's `earliest` hop of `queryable` when it names one;
//! - the *poll bracket*, this poll's response minus that earliest instant: the data became
//!   visible within it, so `queryable` is late by at most that much.
//!
//! Polls are sent by one or more pollers (the `pollers` module), each on a connection of its
//! own; a poll leaves only when a poller is free and at least `poll_interval` after the
//! previous one, and polls slow down towards `idle_poll_interval` after a second without
//! a new key.
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

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use hoptrace_probe::clock::{ClockStatus, Leap, realtime_ns};
use hoptrace_probe::{ClockReporting, Exporter, HopId, Probe, TraceContext, TraceKey};
use hoptrace_protocol::CountersFrame;

use crate::bounds::{Covering, Earliest};
use crate::listen::{self, ListenCounts};
use crate::pollers::{Answer, NOTIFIER, Pollers, Ticket};
use crate::store::{self, Store, StoreError};
use crate::subscribe::{self, SubscribeCounts, Subscription};

mod config;
pub mod counter_id;
mod summary;
mod track;

pub use config::{StoreTapConfig, StoreTapError};
pub use summary::{
    Listened, Spread, StoreTapLive, StoreTapSummary, StoreTimeDisagrees, Subscribed,
};
use track::{Hist, Seen, SeriesSet, Tally};

/// A store tap, connected and ready to poll.
pub struct StoreTap {
    config: StoreTapConfig,
    /// The connection opened at start; the first poller's once polling starts.
    store: Option<Box<dyn Store>>,
    /// What the store says of itself, and the shape of its poll, for the summary.
    describe_store: String,
    query_shape: String,
    /// The resolution of its row times, ns.
    resolution_ns: u64,
    /// How far behind the newest row time a poll looks, as the store is configured, ns.
    overlap_ns: i64,
    newest_ns: Option<i64>,
    notice: Option<String>,
    main: Option<Exporter>,
    store_exporter: Option<Exporter>,
    queryable: Option<Probe>,
    query_start: Option<Probe>,
    queryable_earliest: Option<Probe>,
    store_in: Option<Probe>,
    store_host: String,
    /// The row times are this host's clock and the store's own time of taking the row: a
    /// sharper earliest instant ([`crate::bounds`]).
    store_time_is_ours: bool,
    pollers_used: usize,
    /// The run's series, where the address resolves them (InfluxDB `series=`).
    series: Option<SeriesSet>,
    live: Arc<StoreTapLive>,
    /// The address's `notify=` (PostgreSQL): how to listen, and on which channel.
    listen_target: Option<(tokio_postgres::Config, String)>,
    listen_counts: Arc<ListenCounts>,
    /// The address's `subscribe=` (InfluxDB): where the tap takes what a subscription
    /// sends, and, once made, the subscription's name and destination.
    subscribe_at: Option<std::net::SocketAddr>,
    subscribed: Option<(String, String, String)>,
    subscribe_counts: Arc<SubscribeCounts>,
}

/// A poll loop's state between answers.
struct Loop {
    seen: Seen<TraceKey>,
    /// Rows whose key does not decode, by a hash of the text: counted once each.
    seen_bad: Seen<u64>,
    covering: Covering,
    query_time: Hist,
    server_elapsed: Hist,
    bracket: Hist,
    to_queryable: Hist,
    to_store: Hist,
    c: Tally,
    /// How much further back than the store's overlap polls look (see [`look_back`]).
    widen_ns: i64,
    baseline: bool,
    error_streak: u64,
    last_error: Option<String>,
    sample_failed: bool,
}

/// What [`StoreTap::take`] made of an answer.
enum Taken {
    Failed,
    Answered { found: u64 },
}

/// After this many keys the tap says what it sees of them: whether each came in several
/// rows, and whether a listening tap's came by notification at all.
const CHECK_AFTER: u64 = 1000;

/// What to do when each key comes in several rows.
pub const ROWS_PER_KEY_HINT: &str = "a condition in `where=` that one row per message meets (an equality on a tag or column, e.g. `\"metric\"='m0'`) makes each poll read one row per message and touch fewer series";

/// After a second without a new key, polls slow down towards the idle interval.
const IDLE_AFTER: Duration = Duration::from_secs(1);

/// How soon the run's series are resolved again after a resolution found new ones (and
/// at start); the pace doubles up to `catch_up_interval` while none appear.
const RESOLVE_SOON: Duration = Duration::from_millis(100);

impl std::fmt::Debug for StoreTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreTap")
            .field("store", &self.describe_store)
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
        let store_time_is_ours = config.store_in_hop.is_some() && store_host == this_host;
        let listen_target = if config.url.kind == store::StoreKind::Postgres {
            store::postgres::listen_target(&config.url)?
        } else {
            None
        };
        let subscribe_at = if config.url.kind == store::StoreKind::InfluxDb {
            store::influxdb::subscribe_target(&config.url)?
        } else {
            None
        };
        // The run's series as they are at start: the baseline poll asks for them.
        let series = store
            .resolve_series()
            .map_err(StoreTapError::Store)?
            .map(SeriesSet::new);
        if let Some(s) = &series {
            store.set_series(s.ticket().1);
        }
        let mut tap = Self {
            describe_store: store.describe(),
            query_shape: store.query_shape(),
            resolution_ns: store.time_resolution_ns(),
            overlap_ns: store::duration_ns(store.overlap()),
            store: Some(store),
            newest_ns: opened.newest_ns,
            notice: opened.notice,
            main: None,
            store_exporter: None,
            queryable: None,
            query_start: None,
            queryable_earliest: None,
            store_in: None,
            store_host,
            store_time_is_ours,
            pollers_used: 0,
            series,
            live: Arc::new(StoreTapLive::default()),
            listen_target,
            listen_counts: Arc::new(ListenCounts::default()),
            subscribe_at,
            subscribed: None,
            subscribe_counts: Arc::new(SubscribeCounts::default()),
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
        if let Some((h, n)) = &tap.config.earliest_hop {
            hops.push((*h, n));
        }
        let main = Exporter::connect(exporter.clone(), &hops)?;
        tap.queryable = Some(main.probe(tap.config.queryable_hop.0)?);
        if let Some((h, _)) = &tap.config.query_start_hop {
            tap.query_start = Some(main.probe(*h)?);
        }
        if let Some((h, _)) = &tap.config.earliest_hop {
            tap.queryable_earliest = Some(main.probe(*h)?);
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
        if let Some((_, n)) = &self.config.earliest_hop {
            hops.push(format!("{n} (the earliest instant)"));
        }
        if let Some((_, n)) = &self.config.store_in_hop {
            hops.push(format!("{n} (row time, host {})", self.store_host));
        }
        format!(
            "{}, a poll at most every {:?} from {} poller(s){}",
            self.describe_store,
            self.config.poll_interval,
            self.config.pollers.max(1),
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
        let idle_interval = self.config.idle_poll_interval.max(interval);
        let resolution = i64::try_from(self.resolution_ns).unwrap_or(1);
        let mut l = Loop {
            seen: Seen::new(self.config.dedup_capacity),
            seen_bad: Seen::new(self.config.dedup_capacity),
            covering: Covering::default(),
            query_time: Hist::new(),
            server_elapsed: Hist::new(),
            bracket: Hist::new(),
            to_queryable: Hist::new(),
            to_store: Hist::new(),
            c: Tally::default(),
            widen_ns: 0,
            baseline: true,
            error_streak: 0,
            last_error: None,
            sample_failed: false,
        };
        let mut refused: Option<String> = None;
        let live = Arc::clone(&self.live);
        let mut stores: Vec<Box<dyn Store>> = self.store.take().into_iter().collect();
        for _ in 1..self.config.pollers.max(1) {
            match store::connect(&self.config.url) {
                Ok(s) => stores.push(s),
                Err(e) => {
                    tracing::warn!("a further poller could not be made ({e}): polling with fewer")
                }
            }
        }
        self.pollers_used = stores.len();
        l.c.reconnections = vec![0; stores.len()];
        let mut pollers = match Pollers::start(stores) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::error!("cannot start the pollers: {e}");
                l.last_error = Some(format!("cannot start the pollers: {e}"));
                None
            }
        };
        let listen_stop = Arc::new(AtomicBool::new(false));
        let listener = match (&self.listen_target, pollers.as_ref()) {
            (Some((config, channel)), Some(p)) => {
                tracing::info!(
                    "listening on channel {channel:?} for the rows a trigger notifies (polls go on beside it)"
                );
                listen::start(
                    config.clone(),
                    channel.clone(),
                    p.sender(),
                    Arc::clone(&listen_stop),
                    Arc::clone(&self.listen_counts),
                )
                .map_err(|e| tracing::error!("cannot start the listener: {e} (polling only)"))
                .ok()
            }
            _ => None,
        };
        let subscription = match (self.subscribe_at, pollers.as_ref()) {
            (Some(at), Some(p)) => self.subscribe(at, p.sender()),
            _ => None,
        };
        let mut next_poll = Instant::now();
        let mut next_counters = Instant::now() + self.config.counters_interval;
        let mut backoff = Duration::ZERO;
        // Idle: no key found for a second; polls then slow down, up to the idle interval,
        // and come back to the full rate at the first key found.
        let mut last_found = Instant::now();
        let mut pace = interval;
        // Catch-up polls come every --catch-up-every while they find keys the regular polls
        // missed, and slow down, doubling, while they find none: up to half the catch-up
        // window, so that a row visible up to that much behind is still always found.
        let catch_up_slowest = self.config.catch_up_interval.max(self.config.catch_up / 2);
        let mut catch_up_pace = self.config.catch_up_interval;
        let mut next_catch_up = Instant::now() + catch_up_pace;
        // Series are resolved often while new ones appear (a run starting), less often,
        // up to once a --catch-up-every, while none does.
        let mut resolve_pace = RESOLVE_SOON;
        let mut next_resolve = Instant::now() + resolve_pace;
        while let Some(p) = pollers.as_mut() {
            if shutdown.load(Relaxed)
                || deadline.is_some_and(|d| Instant::now() >= d)
                || self.config.max_keys.is_some_and(|m| l.c.keys_found >= m)
            {
                break;
            }
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
                self.send_counters(&l, started);
            }
            // The run's series again: a new one is polled from the next poll on, and a
            // catch-up poll looks back for its rows at once.
            if self.series.is_some() && !l.baseline && now >= next_resolve && p.any_free() {
                next_resolve = now + resolve_pace;
                if !p.send(Ticket {
                    newest_ns: self.newest_ns,
                    widen_ns: l.widen_ns,
                    catch_up_ns: 0,
                    series: self.series.as_ref().map(SeriesSet::ticket),
                    resolve: true,
                }) {
                    l.last_error = Some("a poller's thread ended".into());
                    break;
                }
            }
            // While keys are being found, a catch-up poll now and then looks further back
            // than the regular ones, for rows that became visible later than they look.
            let catch_up_ns = self.catch_up_ns(l.widen_ns);
            if catch_up_ns > 0
                && !l.baseline
                && now >= next_catch_up
                && last_found.elapsed() < self.config.catch_up
                && p.any_free()
            {
                // The next one is timed from this one's answer (below); until then none.
                next_catch_up = now + catch_up_slowest * 2;
                if p.send(Ticket {
                    newest_ns: self.newest_ns,
                    widen_ns: l.widen_ns,
                    catch_up_ns,
                    series: self.series.as_ref().map(SeriesSet::ticket),
                    resolve: false,
                }) {
                    l.c.polls += 1;
                    l.c.catch_up_polls += 1;
                    live.polls.fetch_add(1, Relaxed);
                } else {
                    l.last_error = Some("a poller's thread ended".into());
                    break;
                }
            }
            // Until the baseline is taken, one poll at a time: the rows already in the store
            // are the first answer's.
            if now >= next_poll && p.any_free() && !(l.baseline && p.in_flight() > 0) {
                if p.send(Ticket {
                    newest_ns: self.newest_ns,
                    widen_ns: l.widen_ns,
                    catch_up_ns: 0,
                    series: self.series.as_ref().map(SeriesSet::ticket),
                    resolve: false,
                }) {
                    l.c.polls += 1;
                    live.polls.fetch_add(1, Relaxed);
                } else {
                    l.last_error = Some("a poller's thread ended".into());
                    break;
                }
                if last_found.elapsed() >= IDLE_AFTER {
                    pace = (pace * 2).min(idle_interval);
                }
                next_poll = now + pace.max(backoff);
            }
            let wait = if p.any_free() {
                next_poll.saturating_duration_since(Instant::now())
            } else {
                Duration::from_millis(50)
            };
            let Some(mut answer) = p.recv(wait.min(Duration::from_millis(50))) else {
                continue;
            };
            if let Some(resolved) = answer.resolved.take() {
                if self.resolved(resolved) {
                    // New series: poll at full rate, look back for their first rows, and
                    // resolve again soon (more may be appearing).
                    last_found = Instant::now();
                    pace = interval;
                    next_poll = Instant::now();
                    next_catch_up = Instant::now();
                    catch_up_pace = self.config.catch_up_interval;
                    resolve_pace = RESOLVE_SOON;
                } else {
                    resolve_pace = (resolve_pace * 2).min(self.config.catch_up_interval);
                }
                next_resolve = Instant::now() + resolve_pace;
                continue;
            }
            let (catch_up, caught) = (answer.catch_up, l.c.caught_up_keys);
            let taken = self.take(&mut l, answer, resolution, p.lowest_since_in_flight());
            if catch_up {
                catch_up_pace = if l.c.caught_up_keys > caught {
                    self.config.catch_up_interval
                } else {
                    (catch_up_pace * 2).min(catch_up_slowest)
                };
                next_catch_up = Instant::now() + catch_up_pace;
                l.c.catch_up_pace_max = l.c.catch_up_pace_max.max(catch_up_pace);
            }
            match taken {
                Taken::Failed => {
                    backoff = (backoff * 2).clamp(
                        interval.max(Duration::from_millis(50)),
                        Duration::from_secs(2),
                    );
                    next_poll = Instant::now() + backoff;
                }
                Taken::Answered { found } => {
                    backoff = Duration::ZERO;
                    if found > 0 {
                        last_found = Instant::now();
                        if pace > interval {
                            pace = interval;
                            next_poll = Instant::now();
                        }
                    }
                }
            }
        }
        // Answers already on their way are taken; a poll still waiting on the store is
        // left to end by itself.
        if let Some(p) = pollers.as_mut() {
            let until = Instant::now() + Duration::from_millis(200);
            while p.in_flight() > 0 && Instant::now() < until {
                if let Some(a) = p.recv(Duration::from_millis(20))
                    && a.resolved.is_none()
                {
                    let floor = p.lowest_since_in_flight();
                    self.take(&mut l, a, resolution, floor);
                }
            }
        }
        listen_stop.store(true, Relaxed);
        if let Some(sub) = subscription {
            sub.stop();
            self.unsubscribe();
        }
        drop(pollers);
        if let Some(t) = listener {
            let _ = t.join();
        }
        self.send_counters(&l, started);
        self.finish(l, started, interval, refused)
    }

    /// Takes one poll's answer: finds the new keys and reports their stamps.
    /// `in_flight_since`: the lowest row time a poll still in flight may return.
    fn take(&mut self, l: &mut Loop, a: Answer, resolution: i64, in_flight_since: i64) -> Taken {
        let live = Arc::clone(&self.live);
        let (send_ns, resp_ns) = (a.send_ns, a.resp_ns);
        if let Some(r) = l.c.reconnections.get_mut(a.poller) {
            *r = a.reconnections;
        }
        let batch = match a.result {
            Ok(b) => b,
            Err(e) => {
                l.c.poll_errors += 1;
                live.poll_errors.fetch_add(1, Relaxed);
                l.error_streak += 1;
                let msg = e.to_string();
                if l.last_error.as_deref() != Some(msg.as_str()) {
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
                l.last_error = Some(msg);
                return Taken::Failed;
            }
        };
        let notified = a.poller == NOTIFIER;
        if l.error_streak > 0 && !notified {
            tracing::info!(
                "the store answers again after {} failed polls",
                l.error_streak
            );
            l.error_streak = 0;
        }
        // Rows a poll read (a notification's row is none: the rows counts are the polls').
        let read = u64::from(!notified);
        let c = &mut l.c;
        if !notified {
            c.answered += 1;
            l.query_time.record(resp_ns - send_ns);
        }
        if let Some(s) = batch.server_elapsed_ns {
            l.server_elapsed
                .record(i64::try_from(s).unwrap_or(i64::MAX));
            c.server_elapsed_sum = c.server_elapsed_sum.saturating_add(s);
            c.server_elapsed_polls += 1;
        }
        c.untraced_rows += batch.untraced;
        let mut found_here = 0u64;
        // The keys this answer found: a row of one of them again is another point or row
        // of the same message.
        let mut found_keys = rustc_hash::FxHashSet::default();
        for row in &batch.rows {
            c.rows += read;
            self.newest_ns = Some(self.newest_ns.map_or(row.time_ns, |n| n.max(row.time_ns)));
            let ctx = match TraceContext::decode_text(&row.key) {
                Ok(ctx) => ctx,
                Err(e) => {
                    let h = std::hash::BuildHasher::hash_one(
                        &rustc_hash::FxBuildHasher,
                        (row.key.as_str(), row.time_ns),
                    );
                    if !l.seen_bad.insert(h, row.time_ns) {
                        c.rows_repeated += read;
                        continue;
                    }
                    if l.baseline {
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
            if !l.seen.insert(ctx.key, row.time_ns) {
                c.rows_repeated += read;
                if found_keys.contains(&ctx.key) {
                    c.rows_sharing_a_key += 1;
                }
                continue;
            }
            if l.baseline {
                c.baseline_keys += 1;
                continue;
            }
            found_keys.insert(ctx.key);
            if let Some(newest) = a.newest_ns {
                let late = newest.saturating_sub(row.time_ns);
                // Behind what a regular poll looked at: only the catch-up found it, and the
                // regular look-back does not widen for it.
                if a.catch_up && a.regular_since_ns.is_some_and(|r| row.time_ns < r) {
                    c.caught_up_keys += 1;
                    c.caught_up_late_max_ns = c.caught_up_late_max_ns.max(late);
                } else if late > 0 {
                    c.late_rows += 1;
                    c.late_max_ns = c.late_max_ns.max(late);
                }
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
            let publish = ctx.stamp_of(self.config.publish_hop).map(|s| s.ns);
            // A poll that did not ask for the row's series proves nothing about it.
            let proof_after = match (&self.series, row.series) {
                (Some(s), Some(i)) => s.proof_after(i),
                _ => i64::MIN,
            };
            let trusted = c.store_time.trusted();
            if let Some(why) = c.store_time.check(
                row.time_ns,
                resp_ns,
                publish,
                i64::try_from(self.resolution_ns).unwrap_or(i64::MAX),
            ) && trusted
            {
                tracing::warn!(
                    "{why}: the row times do not follow this host's clock, so from here on they no longer bound {} from below{} (such rows are counted: store_time_ahead, store_time_behind)",
                    self.config.queryable_hop.1,
                    if self.config.store_in_hop.is_some() {
                        ", and stages to store_in measure that clock's offset as much as latency"
                    } else {
                        ""
                    }
                );
            }
            let earliest = l.covering.earliest(
                row.time_ns,
                resp_ns,
                self.store_time_is_ours && c.store_time.trusted(),
                publish.unwrap_or(ctx.intended_ns),
                proof_after,
            );
            match earliest {
                Earliest::Poll(_) => {}
                Earliest::StoreTime(_) => c.earliest_from_store_time += 1,
                Earliest::Fallback(_) => c.earliest_fallbacks += 1,
            }
            // A full exporter queue is counted by the probe and reported.
            if let Some(p) = &self.query_start {
                p.report_stamp(&ctx, send_ns);
            }
            if let Some(p) = &self.queryable {
                p.report_stamp(&ctx, resp_ns);
            }
            if let Some(p) = &self.queryable_earliest {
                p.report_stamp(&ctx, earliest.ns());
            }
            if let Some(p) = &self.store_in {
                p.report_stamp(&ctx, row.time_ns);
            }
            l.bracket.record(resp_ns - earliest.ns());
            if notified {
                c.keys_notified += 1;
            }
            if let Some(s) = publish {
                l.to_queryable.record(resp_ns - s);
                if self.config.store_in_hop.is_some() {
                    l.to_store.record(row.time_ns - s);
                }
            }
            found_here += 1;
        }
        // At most doubling the look-back at a time: the keys already reported stay known
        // for one look-back below each poll's lower bound, so a poll that looks further
        // back than the one before finds no key twice.
        let widen = widening(self.overlap_ns, c.late_max_ns)
            .min(self.overlap_ns.saturating_add(l.widen_ns.saturating_mul(2)));
        if widen > l.widen_ns {
            tracing::warn!(
                "rows became visible up to {:.1} ms behind the newest row time seen (the store's overlap is {:.1} ms): polls now look {:.1} ms back, so later ones are not missed (late rows are counted)",
                c.late_max_ns as f64 / 1e6,
                self.overlap_ns as f64 / 1e6,
                (self.overlap_ns + widen) as f64 / 1e6
            );
            l.widen_ns = widen;
        }
        if found_here > 0 {
            let before = c.keys_found;
            c.keys_found += found_here;
            if self.listen_target.is_some()
                && before < CHECK_AFTER
                && c.keys_found >= CHECK_AFTER
                && c.keys_notified == 0
            {
                tracing::warn!(
                    "{} keys found and not one notified: does a trigger on the table notify each row on the channel (docs/dataset.md, \"Polled hops\")?",
                    c.keys_found
                );
            }
            if let Some((name, _, destination)) = &self.subscribed
                && before < CHECK_AFTER
                && c.keys_found >= CHECK_AFTER
                && c.keys_notified == 0
            {
                tracing::warn!(
                    "{} keys found and not one by a subscription's write: does InfluxDB send to {destination} (subscription {name}; [subscriber] enabled = true in its configuration, and {destination} reachable from it)?",
                    c.keys_found
                );
            }
            if before < CHECK_AFTER && c.keys_found >= CHECK_AFTER {
                let per_key = summary::rows_per_key(c.keys_found, c.rows_sharing_a_key);
                if per_key >= 2.0 {
                    tracing::warn!(
                        "each key comes in {per_key:.1} rows (a message written as several points or rows), and every poll reads them all: {ROWS_PER_KEY_HINT}"
                    );
                }
            }
            if !notified {
                c.polls_with_keys += 1;
            }
            live.keys_found.fetch_add(found_here, Relaxed);
        }
        if notified {
            // No poll: nothing was covered, no look-back moves, nothing is forgotten.
            return Taken::Answered { found: found_here };
        }
        // This poll covered every row from its lower bound and returned these: a proof for
        // the rows later polls find.
        l.covering.push(a.since_ns, send_ns);
        if let Some(s) = &mut self.series {
            s.answered(a.epoch, send_ns);
        }
        // Keys are forgotten only below every poll that can still answer (this one, and
        // those in flight, which other pollers may answer later), and twice the look-back
        // below that: the next poll looks back at most twice as far (from a newest row
        // time no older), so it finds none of them again.
        // A catch-up poll to come looks back its window from the newest row time (or
        // from now): keys within it stay known too.
        if let Some(s) = a.since_ns {
            let keep = self.overlap_ns.saturating_add(l.widen_ns).saturating_mul(2);
            let mut cutoff = s.min(in_flight_since).saturating_sub(keep);
            if self.catch_up_ns(l.widen_ns) > 0 {
                let from = self.newest_ns.unwrap_or(i64::MAX).min(realtime_ns());
                cutoff = cutoff.min(from.saturating_sub(store::duration_ns(self.config.catch_up)));
            }
            let cutoff = cutoff.saturating_sub(resolution);
            l.seen.forget_before(cutoff);
            l.seen_bad.forget_before(cutoff);
        }
        if l.baseline {
            if c.baseline_keys > 0 {
                tracing::info!(
                    keys = c.baseline_keys,
                    "keys already in the store at start: not reported"
                );
            }
            live.baseline_taken.store(true, Relaxed);
            l.baseline = false;
        }
        match a.own_duration {
            Some(Ok(Some(ns))) => {
                l.server_elapsed
                    .record(i64::try_from(ns).unwrap_or(i64::MAX));
                l.c.server_elapsed_sum = l.c.server_elapsed_sum.saturating_add(ns);
                l.c.server_elapsed_polls += 1;
            }
            Some(Err(e)) if !l.sample_failed => {
                tracing::warn!(
                    "sampling the store's own query duration failed: {e} (further failures are not logged)"
                );
                l.sample_failed = true;
            }
            _ => {}
        }
        Taken::Answered { found: found_here }
    }

    /// The summary, once polling stopped; closes the exporters.
    fn finish(
        mut self,
        l: Loop,
        started: Instant,
        interval: Duration,
        refused: Option<String>,
    ) -> StoreTapSummary {
        let run_id = self.main.as_ref().and_then(Exporter::run_id);
        let mut exporters = Vec::new();
        self.queryable = None;
        self.query_start = None;
        self.queryable_earliest = None;
        self.store_in = None;
        for e in [self.main.take(), self.store_exporter.take()]
            .into_iter()
            .flatten()
        {
            let s = e.shutdown_promptly(hoptrace_probe::AWAY_AT_STOP);
            exporters.push((s.counters, s.clean));
        }
        let c = &l.c;
        StoreTapSummary {
            source: self.describe_store.clone(),
            query: self.query_shape.clone(),
            run_id,
            elapsed_ns: started.elapsed().as_nanos() as u64,
            poll_interval: interval,
            pollers: self.pollers_used,
            polls: c.polls,
            poll_errors: c.poll_errors,
            last_error: l.last_error.clone(),
            query_time: l.query_time.spread(),
            server_elapsed: (!l.server_elapsed.h.is_empty()).then(|| l.server_elapsed.spread()),
            keys_found: c.keys_found,
            polls_with_keys: c.polls_with_keys,
            bad_keys: c.bad_keys,
            rows: c.rows,
            rows_repeated: c.rows_repeated,
            untraced_rows: c.untraced_rows,
            baseline_keys: c.baseline_keys,
            foreign_keys: c.foreign_keys,
            keys_evicted_early: l.seen.evicted_early,
            bracket: l.bracket.spread(),
            earliest_from_store_time: c.earliest_from_store_time,
            earliest_fallbacks: c.earliest_fallbacks,
            store_time_disagrees: c.store_time,
            reconnections: c.reconnections.iter().sum(),
            late_rows: c.late_rows,
            late_max_ns: u64::try_from(c.late_max_ns).unwrap_or(0),
            look_back_ns: u64::try_from(self.overlap_ns.saturating_add(l.widen_ns)).unwrap_or(0),
            catch_up_ns: u64::try_from(self.catch_up_total_ns(&l)).unwrap_or(0),
            catch_up_polls: c.catch_up_polls,
            caught_up_keys: c.caught_up_keys,
            listen: self
                .listen_target
                .as_ref()
                .map(|(_, channel)| channel.clone())
                .or_else(|| self.subscribed.as_ref().map(|(name, _, _)| name.clone()))
                .map(|channel| summary::Listened {
                    channel,
                    notifications: self.listen_counts.notifications.load(Relaxed),
                    keys_notified: c.keys_notified,
                    bad: self.listen_counts.bad.load(Relaxed),
                    errors: self.listen_counts.errors.load(Relaxed),
                    subscription: self.subscribed.as_ref().map(|(_, rp, destination)| {
                        let n = &self.subscribe_counts;
                        summary::Subscribed {
                            retention_policy: rp.clone(),
                            destination: destination.clone(),
                            writes: n.writes.load(Relaxed),
                            queries: n.queries.load(Relaxed),
                            unconfirmed: n.unconfirmed.load(Relaxed),
                            delivery_failures: n.delivery_failures.load(Relaxed),
                        }
                    }),
                }),
            catch_up_pace_max_ns: u64::try_from(c.catch_up_pace_max.as_nanos()).unwrap_or(u64::MAX),
            rows_sharing_a_key: c.rows_sharing_a_key,
            caught_up_late_max_ns: u64::try_from(c.caught_up_late_max_ns).unwrap_or(0),
            series: self
                .series
                .as_ref()
                .map(|s| (s.values.len() as u64, s.resolutions, s.errors)),
            publish_to_queryable: l.to_queryable.spread(),
            publish_to_store: self
                .config
                .store_in_hop
                .is_some()
                .then(|| l.to_store.spread()),
            store_in: self
                .config
                .store_in_hop
                .is_some()
                .then(|| (self.store_host.clone(), self.resolution_ns)),
            notice: self.notice.take(),
            exporters,
            collector_refused: refused,
        }
    }

    /// Binds `at`, subscribes it to the writes InfluxDB accepts and starts taking them;
    /// `None` (polling only, said why) when any of it fails.
    fn subscribe(
        &mut self,
        at: std::net::SocketAddr,
        out: std::sync::mpsc::Sender<Answer>,
    ) -> Option<Subscription> {
        let fail = |what: String| {
            tracing::error!("{what} (polling only)");
        };
        let listener = match std::net::TcpListener::bind(at) {
            Ok(l) => l,
            Err(e) => {
                fail(format!(
                    "cannot take the subscription's writes on {at}: {e}"
                ));
                return None;
            }
        };
        let bound = listener.local_addr().unwrap_or(at);
        let destination = subscribe::destination(bound);
        let name = format!(
            "hoptrace_{}",
            bound
                .to_string()
                .replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        );
        let made = store::influxdb::InfluxDb::new(&self.config.url)
            .map_err(StoreError::from)
            .and_then(|admin| {
                let rp = admin.subscription_rp()?;
                drop_abandoned(&admin, &rp);
                admin.subscribe(&rp, &name, &destination)?;
                let query = store::influxdb::InfluxDb::new(&self.config.url)?;
                Ok((rp, query))
            });
        let (rp, query) = match made {
            Ok(m) => m,
            Err(e) => {
                fail(format!(
                    "cannot create the subscription {name} to {destination}: {e}"
                ));
                return None;
            }
        };
        // A subscription the server's subscriber service does not run sends nothing.
        if let Ok(Some(false)) = query.subscriber_enabled() {
            fail(format!(
                "InfluxDB's subscriber service is off ([subscriber] enabled = false in its configuration): the subscription {name} would send nothing"
            ));
            self.subscribed = Some((name, rp, destination));
            self.unsubscribe();
            self.subscribed = None;
            return None;
        }
        tracing::info!(
            "subscription {name} on retention policy {rp:?} sends every accepted write to {destination}: each one triggers a query for its points (polls go on beside it)"
        );
        match Subscription::start(
            listener,
            query,
            name.clone(),
            out,
            Arc::clone(&self.listen_counts),
            Arc::clone(&self.subscribe_counts),
        ) {
            Ok(s) => {
                self.subscribed = Some((name, rp, destination));
                Some(s)
            }
            Err(e) => {
                fail(format!(
                    "cannot start taking the subscription's writes: {e}"
                ));
                self.subscribed = Some((name, rp, destination));
                self.unsubscribe();
                self.subscribed = None;
                None
            }
        }
    }

    /// Drops the subscription the tap made.
    fn unsubscribe(&mut self) {
        let Some((name, rp, destination)) = &self.subscribed else {
            return;
        };
        let dropped = store::influxdb::InfluxDb::new(&self.config.url)
            .map_err(StoreError::from)
            .and_then(|admin| admin.unsubscribe(rp, name));
        if let Err(e) = dropped {
            tracing::warn!(
                "cannot drop the subscription {name} to {destination}: {e} (InfluxDB goes on sending to it; the next tap with this subscribe= drops it, or DROP SUBSCRIPTION \"{name}\" ON ...)"
            );
        }
    }

    /// Takes a resolution of the run's series; true when it found new ones.
    fn resolved(&mut self, r: Result<Option<Vec<String>>, StoreError>) -> bool {
        let Some(s) = &mut self.series else {
            return false;
        };
        match r {
            Ok(Some(found)) => {
                let added = s.merge(found);
                if added > 0 {
                    tracing::info!(
                        added,
                        polled = s.values.len(),
                        "new series of the run: polled from now on"
                    );
                }
                added > 0
            }
            Ok(None) => false,
            Err(e) => {
                if s.errors == 0 {
                    tracing::warn!(
                        "resolving the run's series failed: {e} (polling on with the {} known; failures are counted)",
                        s.values.len()
                    );
                }
                s.errors += 1;
                false
            }
        }
    }

    /// How much further back than a regular poll a catch-up poll looks now, ns (0: none
    /// is sent, as the regular polls already look back the catch-up window).
    fn catch_up_ns(&self, widen_ns: i64) -> i64 {
        store::duration_ns(self.config.catch_up)
            .saturating_sub(self.overlap_ns.saturating_add(widen_ns))
            .max(0)
    }

    /// How far behind the newest row time catch-up polls look now, ns (0: none are sent).
    fn catch_up_total_ns(&self, l: &Loop) -> i64 {
        if self.catch_up_ns(l.widen_ns) > 0 {
            store::duration_ns(self.config.catch_up)
        } else {
            0
        }
    }

    fn send_counters(&self, l: &Loop, started: Instant) {
        use counter_id as id;
        let Some(e) = &self.main else {
            return;
        };
        let c = &l.c;
        let evicted = l.seen.evicted_early;
        let b = l.bracket.spread();
        let q = l.query_time.spread();
        let server = l.server_elapsed.spread();
        let sum = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
        let (bracket, query_time) = (&l.bracket, &l.query_time);
        let mut values = vec![
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
            (id::EARLIEST_FROM_STORE_TIME, c.earliest_from_store_time),
            (id::EARLIEST_FALLBACKS, c.earliest_fallbacks),
            (id::STORE_TIME_AHEAD, c.store_time.ahead),
            (id::STORE_TIME_AHEAD_MAX_NS, c.store_time.ahead_max_ns),
            (id::STORE_TIME_BEHIND, c.store_time.behind),
            (id::STORE_TIME_BEHIND_MAX_NS, c.store_time.behind_max_ns),
            (id::RECONNECTIONS, c.reconnections.iter().sum()),
            (id::POLLERS, self.pollers_used as u64),
            (id::LATE_ROWS, c.late_rows),
            (id::LATE_MAX_NS, u64::try_from(c.late_max_ns).unwrap_or(0)),
            (
                id::LOOK_BACK_NS,
                u64::try_from(self.overlap_ns.saturating_add(l.widen_ns)).unwrap_or(0),
            ),
            (id::CATCH_UP_POLLS, c.catch_up_polls),
            (id::CAUGHT_UP_KEYS, c.caught_up_keys),
            (
                id::CAUGHT_UP_LATE_MAX_NS,
                u64::try_from(c.caught_up_late_max_ns).unwrap_or(0),
            ),
            (
                id::CATCH_UP_NS,
                u64::try_from(self.catch_up_total_ns(l)).unwrap_or(0),
            ),
        ];
        // (A subscription's counts stay in the tap's summary: its keys came by a query,
        // which these counters, read as notifications that no query found, would misstate.)
        if self.listen_target.is_some() {
            let n = &self.listen_counts;
            values.extend([
                (id::NOTIFICATIONS, n.notifications.load(Relaxed)),
                (id::KEYS_NOTIFIED, c.keys_notified),
                (id::BAD_NOTIFICATIONS, n.bad.load(Relaxed)),
                (id::LISTEN_ERRORS, n.errors.load(Relaxed)),
            ]);
        }
        if let Some(s) = &self.series {
            values.extend([
                (id::SERIES, s.values.len() as u64),
                (id::SERIES_RESOLUTIONS, s.resolutions),
                (id::SERIES_RESOLUTION_ERRORS, s.errors),
            ]);
        }
        if let Err(err) = e.send_counters_frame(CountersFrame {
            at_ns: realtime_ns(),
            values,
        }) {
            tracing::warn!("cannot send the tap's counters: {err}");
        }
    }
}

/// Most a poll looks back beyond the store's overlap.
const MAX_WIDEN: Duration = Duration::from_secs(60);

/// How much further back than the store's `overlap_ns` polls look once rows have been
/// found up to `late_max_ns` behind the newest row time seen: twice that lateness in all,
/// so a row twice as late as any seen so far is still found (at most [`MAX_WIDEN`] more).
fn widening(overlap_ns: i64, late_max_ns: i64) -> i64 {
    late_max_ns
        .saturating_mul(2)
        .saturating_sub(overlap_ns)
        .clamp(0, store::duration_ns(MAX_WIDEN))
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

/// Drops the subscriptions a killed tap left on `rp`: named `hoptrace_…`, sending to an
/// address where nothing listens any more (a connection refused). A tap that runs answers,
/// so its subscription stays; InfluxDB would otherwise go on trying to deliver every write
/// to the dead one.
fn drop_abandoned(admin: &store::influxdb::InfluxDb, rp: &str) {
    let Ok(subscriptions) = admin.subscriptions(rp) else {
        return;
    };
    for (name, to) in subscriptions {
        if !name.starts_with("hoptrace_") {
            continue;
        }
        let refused = to.iter().all(|d| {
            let at = d.strip_prefix("http://").unwrap_or(d);
            std::net::ToSocketAddrs::to_socket_addrs(at)
                .ok()
                .and_then(|mut a| a.next())
                .is_some_and(|a| {
                    std::net::TcpStream::connect_timeout(&a, Duration::from_millis(500))
                        .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
                })
        });
        if refused && !to.is_empty() {
            match admin.unsubscribe(rp, &name) {
                Ok(()) => tracing::info!(
                    "dropped subscription {name} to {}: nothing listens there (a tap that was killed)",
                    to.join(", ")
                ),
                Err(e) => tracing::warn!("cannot drop the abandoned subscription {name}: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests;
