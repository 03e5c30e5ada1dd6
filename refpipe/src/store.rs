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

/// Maps hashed with foldhash: every row of every write and every name of every query is
/// looked up, and SipHash's resistance to crafted keys is not needed here.
type FastMap<V> = HashMap<Box<str>, V, foldhash::fast::RandomState>;

/// Series names interned to dense ids, grouped by parent path (`site/line/cell` of
/// `site/line/cell/temperature`): the rows of one message share their parent, so a write
/// looks each parent up once per run of rows and then searches a small map of leaves,
/// instead of chasing one large table (and a heap string) per row.
#[derive(Debug, Default)]
struct SeriesDict {
    groups: FastMap<FastMap<u32>>,
    len: u32,
}

/// `(parent, leaf)` of a series name; a name without `/` has an empty parent.
fn split_series(name: &str) -> (&str, &str) {
    name.rsplit_once('/').unwrap_or(("", name))
}

impl SeriesDict {
    /// Appends the id of every name to `ids`, giving new names the next ids.
    fn intern_all<'a>(&mut self, names: impl Iterator<Item = &'a str>, ids: &mut Vec<u32>) {
        let mut names = names.map(split_series).peekable();
        while let Some((parent, leaf)) = names.next() {
            let group = match self.groups.get_mut(parent) {
                Some(g) => g,
                None => self.groups.entry(parent.into()).or_default(),
            };
            let mut leaf = leaf;
            loop {
                let id = match group.get(leaf) {
                    Some(id) => *id,
                    None => {
                        let id = self.len;
                        self.len += 1;
                        group.insert(leaf.into(), id);
                        id
                    }
                };
                ids.push(id);
                match names.next_if(|(p, _)| *p == parent) {
                    Some((_, next)) => leaf = next,
                    None => break,
                }
            }
        }
    }

    /// The ids of the names the store has seen; unknown names are left out.
    fn known<S: AsRef<str>>(&self, names: &[S]) -> Vec<u32> {
        let mut ids = Vec::with_capacity(names.len());
        let mut last: Option<(&str, Option<&FastMap<u32>>)> = None;
        for name in names {
            let (parent, leaf) = split_series(name.as_ref());
            let group = match last {
                Some((p, g)) if p == parent => g,
                _ => {
                    let g = self.groups.get(parent);
                    last = Some((parent, g));
                    g
                }
            };
            if let Some(id) = group.and_then(|g| g.get(leaf)) {
                ids.push(*id);
            }
        }
        ids
    }
}

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
    /// Each chunk's `(min_ts_ms, max_ts_ms)`, in the order of `list`: a query prunes by
    /// these without touching the chunks (tens of thousands of them, one per write).
    ranges: VecDeque<(i64, i64)>,
    rows: usize,
}

/// The store. Cheap to share (`Arc`); inserts and queries run concurrently.
#[derive(Debug)]
pub struct Store {
    config: StoreConfig,
    chunks: RwLock<Chunks>,
    series: Mutex<SeriesDict>,
    stats: Mutex<StoreStats>,
}

impl Store {
    /// An empty store.
    #[must_use]
    pub fn new(config: StoreConfig) -> Self {
        Self {
            config,
            chunks: RwLock::new(Chunks::default()),
            series: Mutex::new(SeriesDict::default()),
            stats: Mutex::new(StoreStats::default()),
        }
    }

    /// Stores a batch of rows ([`crate::wire::rows_schema`]); once this returns, every
    /// query sees them.
    #[must_use]
    pub fn insert(&self, rows: &RecordBatch) -> Inserted {
        let names = rows.column(0).as_string::<i32>();
        // Copied out: the decoded columns share one buffer with the series names (and,
        // off the wire, with the whole write), which a chunk must not keep alive.
        let ts_ms = Int64Array::from(rows.column(1).as_primitive::<Int64Type>().values().to_vec());
        let value = Float64Array::from(
            rows.column(2)
                .as_primitive::<Float64Type>()
                .values()
                .to_vec(),
        );
        let series = {
            let mut ids = Vec::with_capacity(names.len());
            self.series
                .lock()
                .expect("series dictionary poisoned")
                .intern_all(names.iter().map(Option::unwrap_or_default), &mut ids);
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
            chunks.ranges.push_back((min_ts_ms, max_ts_ms));
            chunks.rows += n;
            while let Some(old) = chunks.list.front() {
                let too_old = old.inserted.elapsed() > self.config.retention;
                if chunks.list.len() > 1 && (too_old || chunks.rows > self.config.max_rows) {
                    let gone = old.ts_ms.len();
                    chunks.rows -= gone;
                    expired += gone as u64;
                    chunks.list.pop_front();
                    chunks.ranges.pop_front();
                } else {
                    break;
                }
            }
            (chunks.rows, chunks.list.len())
        };
        let series_count = self.series.lock().expect("series dictionary poisoned").len;
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
        self.query_series(&query.series, query.from_ms, query.to_ms)
    }

    /// [`Store::query`] with the series names borrowed: the rows of `series` (every
    /// series when empty) with a timestamp in `from_ms..=to_ms`.
    #[must_use]
    pub fn query_series<S: AsRef<str>>(
        &self,
        series: &[S],
        from_ms: i64,
        to_ms: i64,
    ) -> QueryResult {
        let started = Instant::now();
        let query = Span { from_ms, to_ms };
        // Series the store has never seen match nothing.
        let wanted: Option<Wanted> = if series.is_empty() {
            None
        } else {
            let ids = self
                .series
                .lock()
                .expect("series dictionary poisoned")
                .known(series);
            Some(Wanted::new(&ids))
        };
        let candidates: Vec<Arc<Chunk>> = {
            let chunks = self.chunks.read().expect("chunks poisoned");
            chunks
                .ranges
                .iter()
                .zip(&chunks.list)
                .filter(|((min, max), _)| *max >= query.from_ms && *min <= query.to_ms)
                .map(|(_, c)| c.clone())
                .collect()
        };
        let mut result = QueryResult {
            min_ts_ms: i64::MAX,
            max_ts_ms: i64::MIN,
            ..QueryResult::default()
        };
        if wanted.as_ref().is_none_or(|w| !w.ids.is_empty()) {
            for c in &candidates {
                scan(c, &query, wanted.as_ref(), &mut result);
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

/// A query's time range, ms, inclusive.
struct Span {
    from_ms: i64,
    to_ms: i64,
}

/// Adds the rows of one chunk that match to `out`.
fn scan(c: &Chunk, q: &Span, wanted: Option<&Wanted>, out: &mut QueryResult) {
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
    fn series_ids_are_dense_and_stable_however_names_are_grouped() {
        let mut dict = SeriesDict::default();
        let mut ids = Vec::new();
        let names = ["a/x", "a/y", "b/x", "a/x", "x", "", "a/b/x", "a/y", "b/x"];
        dict.intern_all(names.iter().copied(), &mut ids);
        assert_eq!(ids, [0, 1, 2, 0, 3, 4, 5, 1, 2]);
        assert_eq!(dict.len, 6);
        let mut again = Vec::new();
        dict.intern_all(["b/x", "x", "a/b/x"].into_iter(), &mut again);
        assert_eq!(again, [2, 3, 5]);
        assert_eq!(
            dict.known(&["a/y", "a/z", "c/x", "b/x", "", "a/b/x"]),
            [1, 2, 4, 5]
        );
        assert_eq!(dict.len, 6);
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
                    b.iter().map(|(s, t, v)| (format!("p{}/s{s}", s % 3), *t, f64::from(*v))).collect();
                all.extend(rows.iter().cloned());
                let refs: Vec<(&str, i64, f64)> = rows.iter().map(|(s, t, v)| (s.as_str(), *t, *v)).collect();
                let _ = store.insert(&batch(&refs));
            }
            for (series, from, width) in &queries {
                let names: Vec<String> = series.iter().map(|s| format!("p{}/s{s}", s % 3)).collect();
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
