//! The poll loop's bookkeeping: keys seen, distributions, the run's series, counts.

use std::collections::VecDeque;
use std::sync::Arc;

use hdrhistogram::Histogram;
use rustc_hash::FxHashSet;

use super::summary::{Spread, StoreTimeDisagrees};

/// Keys reported recently, forgotten once older than the poll window.
pub(super) struct Seen<K> {
    pub(super) set: FxHashSet<K>,
    pub(super) order: VecDeque<(i64, K)>,
    pub(super) capacity: usize,
    pub(super) evicted_early: u64,
}

impl<K: std::hash::Hash + Eq + Copy> Seen<K> {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            set: FxHashSet::default(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
            evicted_early: 0,
        }
    }

    /// Remembers `key`; false when it was already there.
    pub(super) fn insert(&mut self, key: K, time_ns: i64) -> bool {
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
    pub(super) fn forget_before(&mut self, cutoff_ns: i64) {
        while let Some(&(t, k)) = self.order.front() {
            if t >= cutoff_ns {
                break;
            }
            self.order.pop_front();
            self.set.remove(&k);
        }
    }
}

pub(super) struct Hist {
    pub(super) h: Histogram<u64>,
    pub(super) sum: u128,
    pub(super) max: u64,
}

impl Hist {
    pub(super) fn new() -> Self {
        Self {
            h: Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds"),
            sum: 0,
            max: 0,
        }
    }

    pub(super) fn record(&mut self, v: i64) {
        let v = u64::try_from(v).unwrap_or(0);
        self.h.saturating_record(v.max(1));
        self.sum += u128::from(v);
        self.max = self.max.max(v);
    }

    pub(super) fn spread(&self) -> Spread {
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

/// The series a store tap polls by value, as resolved so far. The list only grows; each
/// resolution that adds to it starts a new *epoch*, and a poll asks for the series of
/// the epoch its ticket carried. A poll that did not ask for a row's series proves
/// nothing about that row: [`SeriesSet::proof_after`].
pub(super) struct SeriesSet {
    pub(super) values: Arc<[String]>,
    /// Per series, the epoch from which polls ask for it.
    pub(super) joined: Vec<u32>,
    pub(super) epoch: u32,
    /// Per epoch, the latest send of an answered poll of that epoch.
    pub(super) latest_send: Vec<i64>,
    pub(super) resolutions: u64,
    pub(super) errors: u64,
}

impl SeriesSet {
    pub(super) fn new(values: Vec<String>) -> Self {
        Self {
            joined: vec![0; values.len()],
            values: values.into(),
            epoch: 0,
            latest_send: vec![i64::MIN],
            resolutions: 1,
            errors: 0,
        }
    }

    /// Adds the series of `found` not yet polled; returns how many.
    pub(super) fn merge(&mut self, found: Vec<String>) -> usize {
        self.resolutions += 1;
        let known: FxHashSet<&str> = self.values.iter().map(String::as_str).collect();
        let new: Vec<String> = found
            .into_iter()
            .filter(|v| !known.contains(v.as_str()))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if new.is_empty() {
            return 0;
        }
        self.epoch += 1;
        self.latest_send.push(i64::MIN);
        self.joined
            .extend(std::iter::repeat_n(self.epoch, new.len()));
        let mut all = self.values.to_vec();
        all.extend(new);
        let added = all.len() - self.values.len();
        self.values = all.into();
        added
    }

    /// A poll of `epoch` sent at `send_ns` was answered.
    pub(super) fn answered(&mut self, epoch: u32, send_ns: i64) {
        if let Some(s) = self.latest_send.get_mut(epoch as usize) {
            *s = (*s).max(send_ns);
        }
    }

    /// The latest send of an answered poll that did not ask for series `i`: only a poll
    /// sent after it can prove that a row of that series was not yet visible.
    pub(super) fn proof_after(&self, i: u32) -> i64 {
        let joined = self.joined.get(i as usize).copied().unwrap_or(u32::MAX) as usize;
        self.latest_send
            .iter()
            .take(joined)
            .copied()
            .max()
            .unwrap_or(i64::MIN)
    }

    pub(super) fn ticket(&self) -> (u32, Arc<[String]>) {
        (self.epoch, Arc::clone(&self.values))
    }
}

/// The loop's counts.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) polls: u64,
    pub(super) answered: u64,
    pub(super) poll_errors: u64,
    pub(super) keys_found: u64,
    pub(super) polls_with_keys: u64,
    pub(super) bad_keys: u64,
    pub(super) rows: u64,
    pub(super) rows_repeated: u64,
    pub(super) untraced_rows: u64,
    pub(super) baseline_keys: u64,
    pub(super) foreign_keys: u64,
    pub(super) server_elapsed_sum: u64,
    pub(super) server_elapsed_polls: u64,
    pub(super) earliest_from_store_time: u64,
    pub(super) earliest_fallbacks: u64,
    pub(super) late_rows: u64,
    pub(super) late_max_ns: i64,
    pub(super) store_time: StoreTimeDisagrees,
    /// Per poller, its connection's reconnections so far.
    pub(super) reconnections: Vec<u64>,
    pub(super) catch_up_polls: u64,
    pub(super) caught_up_keys: u64,
    pub(super) caught_up_late_max_ns: i64,
    /// The longest pause between catch-up polls so far.
    pub(super) catch_up_pace_max: std::time::Duration,
    /// Rows of a key its own poll had already returned in another row.
    pub(super) rows_sharing_a_key: u64,
    /// Keys a store's notification found before any poll.
    pub(super) keys_notified: u64,
}
