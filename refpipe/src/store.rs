//! An embedded columnar time-series store: rows arrive in batches, become visible to
//! queries atomically, are kept as Arrow columns in chunks with time statistics, and are
//! dropped after a retention period.
//!
//! A query asks for the rows of some series in a time range. It prunes chunks by their
//! time range (as a Parquet reader prunes row groups by statistics), then scans the
//! surviving chunks' columns with Arrow compute kernels.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use arrow::array::{
    Array, AsArray, BooleanArray, Float64Array, Int64Array, RecordBatch, UInt32Array,
};
use arrow::compute::kernels::{aggregate, boolean, cmp, filter};
use arrow::datatypes::{Float64Type, Int64Type};
use std::collections::HashMap;

use crate::wire::{Query, QueryResult};

/// How much the store keeps.
#[derive(Debug, Clone, Copy)]
pub struct StoreConfig {
    /// Chunks older than this (by insertion time) are dropped.
    pub retention: Duration,
    /// Most rows kept; the oldest chunks are dropped beyond it.
    pub max_rows: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(30),
            max_rows: 50_000_000,
        }
    }
}

/// One inserted batch: columns and their time range.
#[derive(Debug)]
struct Chunk {
    series: UInt32Array,
    ts_ms: Int64Array,
    value: Float64Array,
    min_ts_ms: i64,
    max_ts_ms: i64,
    inserted: Instant,
}

/// What an insert did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inserted {
    /// Rows stored.
    pub rows: usize,
    /// Index of the first row of each distinct series of the batch, in series order.
    pub first_rows: Vec<u32>,
    /// Smallest timestamp of the batch, ms.
    pub min_ts_ms: i64,
    /// Largest timestamp of the batch, ms.
    pub max_ts_ms: i64,
}

/// Counts of a store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Rows ever inserted.
    pub rows_inserted: u64,
    /// Rows held now.
    pub rows_held: u64,
    /// Chunks held now.
    pub chunks_held: u64,
    /// Rows dropped by retention.
    pub rows_expired: u64,
    /// Distinct series seen.
    pub series: u64,
    /// Queries answered.
    pub queries: u64,
}

/// The chunks held, oldest first, and their rows.
#[derive(Debug, Default)]
struct Chunks {
    list: VecDeque<Arc<Chunk>>,
    rows: usize,
}

/// The store. Cheap to share (`Arc`); inserts and queries run concurrently.
#[derive(Debug)]
pub struct Store {
    config: StoreConfig,
    chunks: RwLock<Chunks>,
    series: Mutex<HashMap<String, u32>>,
    stats: Mutex<StoreStats>,
}

impl Store {
    /// An empty store.
    #[must_use]
    pub fn new(config: StoreConfig) -> Self {
        Self {
            config,
            chunks: RwLock::new(Chunks::default()),
            series: Mutex::new(HashMap::new()),
            stats: Mutex::new(StoreStats::default()),
        }
    }

    /// Stores a batch of rows ([`crate::wire::rows_schema`]); once this returns, every
    /// query sees them.
    #[must_use]
    pub fn insert(&self, rows: &RecordBatch) -> Inserted {
        let names = rows.column(0).as_string::<i32>();
        let ts_ms = rows.column(1).as_primitive::<Int64Type>().clone();
        let value = rows.column(2).as_primitive::<Float64Type>().clone();
        let series = {
            let mut dict = self.series.lock().expect("series dictionary poisoned");
            let mut ids = Vec::with_capacity(names.len());
            for name in names.iter() {
                let name = name.unwrap_or_default();
                let next = dict.len() as u32;
                let id = match dict.get(name) {
                    Some(id) => *id,
                    None => *dict.entry(name.to_owned()).or_insert(next),
                };
                ids.push(id);
            }
            UInt32Array::from(ids)
        };
        let first_rows = {
            let mut pairs: Vec<(u32, u32)> = series
                .values()
                .iter()
                .enumerate()
                .map(|(row, &id)| (id, row as u32))
                .collect();
            pairs.sort_unstable();
            pairs.dedup_by_key(|p| p.0);
            pairs.into_iter().map(|(_, row)| row).collect()
        };
        let min_ts_ms = aggregate::min(&ts_ms).unwrap_or(i64::MAX);
        let max_ts_ms = aggregate::max(&ts_ms).unwrap_or(i64::MIN);
        let n = ts_ms.len();
        let chunk = Arc::new(Chunk {
            series,
            ts_ms,
            value,
            min_ts_ms,
            max_ts_ms,
            inserted: Instant::now(),
        });
        let mut expired = 0u64;
        let (held_rows, held_chunks) = {
            let mut chunks = self.chunks.write().expect("chunks poisoned");
            chunks.list.push_back(chunk);
            chunks.rows += n;
            while let Some(old) = chunks.list.front() {
                let too_old = old.inserted.elapsed() > self.config.retention;
                if chunks.list.len() > 1 && (too_old || chunks.rows > self.config.max_rows) {
                    let gone = old.ts_ms.len();
                    chunks.rows -= gone;
                    expired += gone as u64;
                    chunks.list.pop_front();
                } else {
                    break;
                }
            }
            (chunks.rows, chunks.list.len())
        };
        let series_count = self
            .series
            .lock()
            .expect("series dictionary poisoned")
            .len();
        let mut s = self.stats.lock().expect("stats poisoned");
        s.rows_inserted += n as u64;
        s.rows_expired += expired;
        s.rows_held = held_rows as u64;
        s.chunks_held = held_chunks as u64;
        s.series = series_count as u64;
        Inserted {
            rows: n,
            first_rows,
            min_ts_ms,
            max_ts_ms,
        }
    }

    /// Answers a query: the rows of `query.series` (every series when empty) with a
    /// timestamp in `from_ms..=to_ms`.
    #[must_use]
    pub fn query(&self, query: &Query) -> QueryResult {
        let started = Instant::now();
        // Series the store has never seen match nothing.
        let wanted: Option<Wanted> = if query.series.is_empty() {
            None
        } else {
            let dict = self.series.lock().expect("series dictionary poisoned");
            let ids: Vec<u32> = query
                .series
                .iter()
                .filter_map(|s| dict.get(s.as_str()).copied())
                .collect();
            Some(Wanted::new(&ids))
        };
        let candidates: Vec<Arc<Chunk>> = self
            .chunks
            .read()
            .expect("chunks poisoned")
            .list
            .iter()
            .filter(|c| c.max_ts_ms >= query.from_ms && c.min_ts_ms <= query.to_ms)
            .cloned()
            .collect();
        let mut result = QueryResult {
            min_ts_ms: i64::MAX,
            max_ts_ms: i64::MIN,
            ..QueryResult::default()
        };
        if wanted.as_ref().is_none_or(|w| !w.ids.is_empty()) {
            for c in &candidates {
                scan(c, query, wanted.as_ref(), &mut result);
            }
        }
        result.exec_ns = started.elapsed().as_nanos() as u64;
        self.stats.lock().expect("stats poisoned").queries += 1;
        result
    }

    /// Counts so far.
    #[must_use]
    pub fn stats(&self) -> StoreStats {
        *self.stats.lock().expect("stats poisoned")
    }
}

/// The series a query asks for: their ids, and a bitmap over ids for membership tests
/// in constant time.
struct Wanted {
    ids: Vec<u32>,
    bits: Vec<u64>,
}

impl Wanted {
    fn new(ids: &[u32]) -> Self {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let words = ids.last().map_or(0, |&m| m as usize / 64 + 1);
        let mut bits = vec![0u64; words];
        for &id in &ids {
            bits[id as usize / 64] |= 1 << (id % 64);
        }
        Self { ids, bits }
    }

    #[inline]
    fn contains(&self, id: u32) -> bool {
        self.bits
            .get(id as usize / 64)
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }
}

/// Adds the rows of one chunk that match to `out`.
fn scan(c: &Chunk, q: &Query, wanted: Option<&Wanted>, out: &mut QueryResult) {
    let from = Int64Array::new_scalar(q.from_ms);
    let to = Int64Array::new_scalar(q.to_ms);
    let mut mask = match (c.min_ts_ms >= q.from_ms, c.max_ts_ms <= q.to_ms) {
        (true, true) => BooleanArray::from(vec![true; c.ts_ms.len()]),
        (true, false) => cmp::lt_eq(&c.ts_ms, &to).expect("same types"),
        (false, true) => cmp::gt_eq(&c.ts_ms, &from).expect("same types"),
        (false, false) => boolean::and(
            &cmp::gt_eq(&c.ts_ms, &from).expect("same types"),
            &cmp::lt_eq(&c.ts_ms, &to).expect("same types"),
        )
        .expect("same lengths"),
    };
    if let Some(w) = wanted {
        let member = if let [one] = w.ids[..] {
            cmp::eq(&c.series, &UInt32Array::new_scalar(one)).expect("same types")
        } else {
            BooleanArray::from_iter(c.series.values().iter().map(|&id| Some(w.contains(id))))
        };
        mask = boolean::and(&mask, &member).expect("same lengths");
    }
    let hits = mask.true_count();
    if hits == 0 {
        return;
    }
    let ts = filter::filter(&c.ts_ms, &mask).expect("same lengths");
    let ts = ts.as_primitive::<Int64Type>();
    let values = filter::filter(&c.value, &mask).expect("same lengths");
    out.rows += hits as u64;
    out.sum += aggregate::sum(values.as_primitive::<Float64Type>()).unwrap_or(0.0);
    out.min_ts_ms = out.min_ts_ms.min(aggregate::min(ts).unwrap_or(i64::MAX));
    out.max_ts_ms = out.max_ts_ms.max(aggregate::max(ts).unwrap_or(i64::MIN));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::rows_batch;
    use arrow::array::StringArray;
    use proptest::prelude::*;

    fn batch(rows: &[(&str, i64, f64)]) -> RecordBatch {
        rows_batch(
            StringArray::from_iter_values(rows.iter().map(|r| r.0)),
            Int64Array::from_iter_values(rows.iter().map(|r| r.1)),
            Float64Array::from_iter_values(rows.iter().map(|r| r.2)),
        )
        .unwrap()
    }

    fn q(series: &[&str], from_ms: i64, to_ms: i64) -> Query {
        Query {
            series: series.iter().map(|s| (*s).to_owned()).collect(),
            from_ms,
            to_ms,
        }
    }

    #[test]
    fn rows_are_visible_once_inserted() {
        let store = Store::new(StoreConfig::default());
        assert_eq!(store.query(&q(&[], i64::MIN, i64::MAX)).rows, 0);
        let ins = store.insert(&batch(&[("a", 10, 1.0), ("b", 11, 2.0), ("a", 12, 4.0)]));
        assert_eq!((ins.rows, ins.min_ts_ms, ins.max_ts_ms), (3, 10, 12));
        let r = store.query(&q(&["a"], 0, 100));
        assert_eq!((r.rows, r.sum, r.min_ts_ms, r.max_ts_ms), (2, 5.0, 10, 12));
        let r = store.query(&q(&["a", "b"], 11, 11));
        assert_eq!((r.rows, r.sum), (1, 2.0));
        assert_eq!(store.query(&q(&["never"], 0, 100)).rows, 0);
        assert_eq!(store.query(&q(&[], 13, 100)).rows, 0);
        let s = store.stats();
        assert_eq!(
            (s.rows_inserted, s.rows_held, s.series, s.queries),
            (3, 3, 2, 5)
        );
    }

    #[test]
    fn retention_drops_the_oldest_chunks_by_rows() {
        let store = Store::new(StoreConfig {
            retention: Duration::from_secs(3600),
            max_rows: 4,
        });
        for i in 0..5 {
            let _ = store.insert(&batch(&[("a", i, 1.0), ("a", i, 1.0)]));
        }
        let s = store.stats();
        assert_eq!((s.rows_held, s.rows_expired, s.chunks_held), (4, 6, 2));
        assert_eq!(store.query(&q(&["a"], 0, 100)).rows, 4);
    }

    proptest! {
        /// Every query agrees with a naive scan of everything inserted.
        #[test]
        fn queries_match_a_naive_scan(
            batches in proptest::collection::vec(
                proptest::collection::vec((0u8..6, -50i64..50, -100i32..100), 0..40), 1..8),
            queries in proptest::collection::vec(
                (proptest::collection::vec(0u8..8, 0..4), -60i64..60, 0i64..60), 1..10),
        ) {
            let store = Store::new(StoreConfig::default());
            let mut all = Vec::new();
            for b in &batches {
                let rows: Vec<(String, i64, f64)> =
                    b.iter().map(|(s, t, v)| (format!("s{s}"), *t, f64::from(*v))).collect();
                all.extend(rows.iter().cloned());
                let refs: Vec<(&str, i64, f64)> = rows.iter().map(|(s, t, v)| (s.as_str(), *t, *v)).collect();
                let _ = store.insert(&batch(&refs));
            }
            for (series, from, width) in &queries {
                let names: Vec<String> = series.iter().map(|s| format!("s{s}")).collect();
                let query = Query { series: names.clone(), from_ms: *from, to_ms: from + width };
                let got = store.query(&query);
                let hits: Vec<&(String, i64, f64)> = all
                    .iter()
                    .filter(|(s, t, _)| (names.is_empty() || names.contains(s)) && *t >= query.from_ms && *t <= query.to_ms)
                    .collect();
                prop_assert_eq!(got.rows, hits.len() as u64);
                prop_assert_eq!(got.sum, hits.iter().map(|h| h.2).sum::<f64>());
                if !hits.is_empty() {
                    prop_assert_eq!(got.min_ts_ms, hits.iter().map(|h| h.1).min().unwrap());
                    prop_assert_eq!(got.max_ts_ms, hits.iter().map(|h| h.1).max().unwrap());
                }
            }
        }
    }
}
