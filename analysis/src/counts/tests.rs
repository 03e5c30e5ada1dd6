use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::array::{BooleanArray, UInt64Array};
use datafusion::arrow::datatypes::Field;
use proptest::prelude::*;

use super::sets::{Block, KEY_BLOCK, Layout, MAX_LANES};
use super::*;

proptest! {
    #[test]
    fn trace_counts_count_and_round_trip(
        rows in prop::collection::vec(
            (
                prop_oneof![0_u64..3, 0_u64..5_000, 0_u64..u64::MAX],
                0_u64..3,
                any::<bool>(),
                0_u64..4,
                0_u64..64,
                prop_oneof![0_u64..30, 0_u64..u64::MAX],
            ),
            0..200,
        ),
        split in 0_usize..200,
    ) {
        type Row = (u64, u64, bool, u64, u64, u64);
        let split = split.min(rows.len());
        let batch = |rows: &[Row]| -> Vec<ArrayRef> {
            let u = |f: fn(&Row) -> u64| -> ArrayRef {
                Arc::new(UInt64Array::from_iter_values(rows.iter().map(f)))
            };
            vec![
                u(|r| r.0),
                u(|r| r.1),
                Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(r.2)))),
                u(|r| r.3),
                u(|r| r.4),
                u(|r| r.5),
            ]
        };
        let (mut a, mut b) = (TraceCounts::default(), TraceCounts::default());
        a.add_batch(&batch(&rows[..split])).unwrap();
        b.add_batch(&batch(&rows[split..])).unwrap();
        let mut c = TraceCounts::decode(&a.encode()).unwrap();
        c.add_counts(&TraceCounts::decode(&b.encode()).unwrap());
        let distinct = |f: fn(&Row) -> u64| {
            rows.iter().map(f).collect::<HashSet<u64>>().len() as u64
        };
        let bit = |f: fn(&Row) -> u64, b: usize| {
            rows.iter().filter(|r| f(r) & (1 << b) != 0).count() as u64
        };
        prop_assert_eq!(c.rows, rows.len() as u64);
        prop_assert_eq!(c.complete, rows.iter().filter(|r| r.2).count() as u64);
        prop_assert_eq!(c.streams(), distinct(|r| r.0));
        prop_assert_eq!(c.publishers(), distinct(|r| r.1));
        for b in 0..8 {
            prop_assert_eq!(c.flag(b), bit(|r| r.3, b));
            prop_assert_eq!(c.missing(b), bit(|r| r.4, b));
        }
        let keys = rows
            .iter()
            .map(|r| (r.1, r.0, r.5))
            .collect::<HashSet<_>>()
            .len() as u64;
        prop_assert_eq!(c.distinct_keys(), keys);
        prop_assert_eq!(c.repeated_keys(), rows.len() as u64 - keys);
    }
}

proptest! {
    /// One publisher's batches (the usual ones, filled a block's run of rows at a
    /// time): streams in turn or at random, sequences in order or not, repeats; the
    /// same keys and repeats as one key at a time.
    #[test]
    fn one_publishers_rows_count_as_key_by_key(
        streams in 1_u64..200,
        rounds in 1_u64..40,
        shuffle in any::<bool>(),
        repeats in prop::collection::vec(0_usize..8_000, 0..50),
        seed in any::<u64>(),
        split in 0_usize..8_000,
    ) {
        let mut keys: Vec<(u64, u64)> = (0..rounds)
            .flat_map(|q| (0..streams).map(move |s| (s, q + 10 * (s % 3))))
            .collect();
        for r in repeats {
            if let Some(&k) = keys.get(r) {
                keys.push(k);
            }
        }
        if shuffle {
            // A fixed permutation from the seed.
            let n = keys.len();
            let mut x = seed | 1;
            for i in (1..n).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                keys.swap(i, (x % (i as u64 + 1)) as usize);
            }
        }
        let split = split.min(keys.len());
        let column = |v: Vec<u64>| PrimitiveArray::<UInt64Type>::from(v);
        let mut rows = KeySet::default();
        for part in [&keys[..split], &keys[split..]] {
            rows.insert_rows(
                &column(vec![4; part.len()]),
                &column(part.iter().map(|k| k.0).collect()),
                &column(part.iter().map(|k| k.1).collect()),
            );
        }
        let mut one = KeySet::default();
        for &(s, q) in &keys {
            one.insert(4, s, q, Layout::default);
        }
        let distinct = keys.iter().collect::<HashSet<_>>().len() as u64;
        prop_assert_eq!((rows.keys, rows.repeated), (distinct, keys.len() as u64 - distinct));
        prop_assert_eq!(&rows, &one);
    }
}

/// Keys the index does not hold (a 65th publisher, a stream numbered 2^16 or more,
/// blocks before a group's first one or 4096 blocks after it) go through the map,
/// and every key is still counted once, whatever the order of rows, the layout of
/// blocks and merges.
#[test]
fn keys_outside_the_index_count_once() {
    let mut keys: Vec<(u64, u64, u64)> = Vec::new();
    for p in 0..70 {
        keys.push((p, 1, 5));
    }
    for st in [0, 65_535, 65_536, u64::MAX] {
        keys.extend([(1, st, 10_000), (1, st, 3), (1, st, 10_000 + 4_096 * 4_096)]);
    }
    keys.extend([(2, 9, u64::MAX), (2, 9, 0), (2, 9, 1 << 40)]);
    let distinct = keys.iter().collect::<HashSet<_>>().len() as u64;
    for lanes in [(0, 0), (0, 6), (6, 6), (3, 1)] {
        // Each key twice: once in each of two sets filled in opposite orders.
        let (mut a, mut b) = (KeySet::default(), KeySet::default());
        for &(p, st, q) in &keys {
            a.insert(p, st, q, || Layout { lanes: lanes.0 });
        }
        for &(p, st, q) in keys.iter().rev() {
            b.insert(p, st, q, || Layout { lanes: lanes.1 });
        }
        assert_eq!((a.keys, a.repeated), (distinct, 0));
        assert_eq!(a, b);
        let mut out = Vec::new();
        b.encode(&mut out);
        a.merge(&KeySet::decode(&mut Reader::new(&out)).unwrap());
        assert_eq!((a.keys, a.repeated), (distinct, distinct), "{lanes:?}");
    }
}

/// A key's place in a block and back, in every layout, at the ends of the ranges.
#[test]
fn layouts_place_keys_and_read_them_back() {
    for lanes in 0..=MAX_LANES {
        let layout = Layout { lanes };
        for (s, q) in [
            (0, 0),
            (63, 4095),
            (u64::MAX, u64::MAX),
            (1 << 40, 3),
            (5, 1 << 50),
        ] {
            let (g, b, o) = layout.place(s, q);
            assert!(u64::from(o) < KEY_BLOCK && layout.holds(g, b));
            assert_eq!(layout.key(g, b, o), (s, q), "{lanes} {s} {q}");
        }
        assert!(!layout.holds(u64::MAX, u64::MAX));
    }
    // Streams side by side: 64 streams at one sequence set bits of one word.
    let six = Layout { lanes: 6 };
    let words: HashSet<(u64, u64, u16)> = (0..64)
        .map(|s| {
            let (g, b, o) = six.place(s, 77);
            (g, b, o >> 6)
        })
        .collect();
    assert_eq!(words.len(), 1);
    let lanes = |streams: &[u64]| Layout::for_streams(streams).lanes;
    assert_eq!(lanes(&[7, 7, 7]), 0);
    assert_eq!(lanes(&[0, 1, 2]), 2);
    assert_eq!(lanes(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]), 4);
    assert_eq!(lanes(&(0..3_000).rev().collect::<Vec<_>>()), 6);
    // Scattered numbers (hashes): a stream per block.
    assert_eq!(lanes(&[3, 1 << 20, 77_777, 1 << 31, u64::MAX]), 0);
    // Two dense runs far apart: still side by side.
    assert_eq!(
        lanes(&(0..64).chain(1 << 30..(1 << 30) + 64).collect::<Vec<_>>()),
        6
    );
}

/// Blocks fill whether a publisher's stream numbers are neighbours or scattered: about
/// a bit per key either way, not a list of 64 keys per block.
#[test]
fn scattered_and_neighbouring_streams_fill_their_blocks() {
    let column = |v: Vec<u64>| PrimitiveArray::<UInt64Type>::from(v);
    for (streams, rounds, most_blocks) in [
        // 4 streams numbered like hashes, 100k sequences each: 25 blocks of 4096 each.
        (vec![3, 1 << 20, 77_777, 1 << 31], 100_000, 4 * 25),
        // 3000 streams from 0, 128 sequences each: 47 groups x 2 blocks of 64.
        ((0..3_000).collect::<Vec<u64>>(), 128, 47 * 2),
    ] {
        let mut set = KeySet::default();
        let keys: Vec<(u64, u64)> = (0..rounds)
            .flat_map(|q| streams.iter().map(move |&s| (s, q)))
            .collect();
        for batch in keys.chunks(8192) {
            set.insert_rows(
                &column(vec![1; batch.len()]),
                &column(batch.iter().map(|k| k.0).collect()),
                &column(batch.iter().map(|k| k.1).collect()),
            );
        }
        assert_eq!((set.keys, set.repeated), (keys.len() as u64, 0));
        assert!(
            set.blocks.len() <= most_blocks,
            "{} blocks",
            set.blocks.len()
        );
        assert!(set.blocks.iter().all(|(_, b)| matches!(b, Block::Dense(_))));
    }
}

/// Key sets whose blocks turn into bitmaps merge block by block (or key by key
/// between layouts), through their binary form, to the keys and repeats counted one
/// by one; a malformed block or set is refused.
#[test]
fn dense_key_sets_merge_and_round_trip() {
    for lanes in [(0, 0), (0, 6), (6, 6), (2, 5)] {
        // Stream 7: sequences 0..9000 in one set, 4000..13000 (and 5000 twice) in the
        // other; stream 8: a few sparse ones in both.
        let (mut a, mut b) = (KeySet::default(), KeySet::default());
        let (la, lb) = (Layout { lanes: lanes.0 }, Layout { lanes: lanes.1 });
        let mut all: Vec<(u64, u64, u64)> = Vec::new();
        for q in 0..9_000 {
            a.insert(1, 7, q, || la);
            all.push((1, 7, q));
        }
        for q in (4_000..13_000).chain([5_000]) {
            b.insert(1, 7, q, || lb);
            all.push((1, 7, q));
        }
        for q in [3, 90, 4_095, 4_096] {
            a.insert(1, 8, q, || la);
            b.insert(1, 8, q, || lb);
            all.extend([(1, 8, q), (1, 8, q)]);
        }
        assert!(
            a.blocks.iter().any(|(_, b)| matches!(b, Block::Dense(_))) || lanes.0 > 0,
            "one stream fills bitmaps"
        );
        let decode = |s: &KeySet| {
            let mut out = Vec::new();
            s.encode(&mut out);
            let mut r = Reader::new(&out);
            let back = KeySet::decode(&mut r).unwrap();
            r.finish().unwrap();
            back
        };
        let mut merged = decode(&a);
        assert_eq!(merged, a);
        merged.merge(&decode(&b));
        let distinct = all.iter().collect::<HashSet<_>>().len() as u64;
        assert_eq!(merged.keys, distinct, "{lanes:?}");
        assert_eq!(merged.keys + merged.repeated, all.len() as u64);
        assert_eq!(merged.sorted_keys().len() as u64, distinct);
    }

    // A list whose offsets do not increase, a list too long, an unknown kind.
    let varints = |v: &[u64]| {
        let mut bytes = Vec::new();
        v.iter().for_each(|&v| put(&mut bytes, v));
        bytes
    };
    for bad in [vec![0, 2, 5, 0], vec![0, 300], vec![2]] {
        let bytes = varints(&bad);
        let block = Block::decode(&mut Reader::new(&bytes));
        assert_eq!(block, Err(DecodeError), "{bad:?}");
    }
    // Sets: 7 lanes; a publisher listed twice; a block of a publisher not listed
    // while the list has room; a block beyond 64-bit keys.
    for bad in [
        vec![0, 1, 4, 7, 0],
        vec![0, 2, 4, 1, 4, 1, 0],
        vec![0, 1, 4, 1, 1, 5, 0, 0, 0, 0],
        vec![0, 1, 4, 6, 1, 4, 0, u64::MAX, 0, 0],
    ] {
        let bytes = varints(&bad);
        let set = KeySet::decode(&mut Reader::new(&bytes));
        assert_eq!(set, Err(DecodeError), "{bad:?}");
    }
}

/// Through DataFusion, over the collector's column types, against its own aggregates.
#[test]
fn trace_counts_in_sql_agrees_with_the_standard_aggregates() {
    use datafusion::arrow::array::{StringArray, UInt8Array, UInt16Array, UInt32Array};
    use datafusion::arrow::datatypes::Schema;
    use datafusion::datasource::MemTable;
    use datafusion::prelude::{SessionConfig, SessionContext};

    let schema = Arc::new(Schema::new(vec![
        Field::new("stream", DataType::UInt32, false),
        Field::new("publisher", DataType::UInt16, true),
        Field::new("status", DataType::Utf8, false),
        Field::new("flags", DataType::UInt8, false),
        Field::new("missing_mask", DataType::UInt16, false),
        Field::new("sequence", DataType::UInt64, false),
    ]));
    let part = |seed: u32| {
        let n = 3_000_u32;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(UInt32Array::from_iter_values((0..n).map(|i| {
                (i * 7 + seed) % 101 + u32::from(i % 500 == 0) * 9_000_000
            }))),
            Arc::new(UInt16Array::from_iter(
                (0..n).map(|i| (i % 13 != 0).then_some((i / 1_000 + seed) as u16)),
            )),
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|i| if i % 7 == 0 { "incomplete" } else { "complete" }),
            )),
            Arc::new(UInt8Array::from_iter_values(
                (0..n).map(|i| (i % 5 == 0) as u8 * 3),
            )),
            Arc::new(UInt16Array::from_iter_values(
                (0..n).map(|i| if i % 7 == 0 { 1 << (i % 6) } else { 0 }),
            )),
            // Rows 101 apart share their stream, and their sequence: keys repeat.
            Arc::new(UInt64Array::from_iter_values(
                (0..n).map(|i| u64::from(i % 101)),
            )),
        ];
        datafusion::arrow::array::RecordBatch::try_new(schema.clone(), columns).unwrap()
    };
    let table = MemTable::try_new(schema.clone(), vec![vec![part(0)], vec![part(5)]]).unwrap();
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2));
    ctx.register_table("t", Arc::new(table)).unwrap();
    ctx.register_udaf(trace_counts_udaf());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let q = "SELECT trace_counts(stream, publisher, status = 'complete', flags, missing_mask, sequence), \
             count(*), count(DISTINCT stream), count(DISTINCT publisher), \
             count(*) FILTER (WHERE status = 'complete'), \
             count(*) FILTER (WHERE (flags & 1) <> 0), count(*) FILTER (WHERE (flags & 2) <> 0), \
             count(*) FILTER (WHERE (missing_mask & 1) <> 0), \
             count(*) FILTER (WHERE (missing_mask & 32) <> 0) FROM t";
    let batches = rt
        .block_on(async { ctx.sql(q).await?.collect().await })
        .unwrap();
    let b = &batches[0];
    let c = TraceCounts::decode(b.column(0).as_binary::<i32>().value(0)).unwrap();
    let n = |i: usize| b.column(i).as_primitive::<Int64Type>().value(0) as u64;
    assert_eq!(
        [c.rows, c.streams(), c.publishers(), c.complete],
        [n(1), n(2), n(3), n(4)]
    );
    assert_eq!(
        [c.flag(0), c.flag(1), c.missing(0), c.missing(5)],
        [n(5), n(6), n(7), n(8)]
    );
    assert!(c.missing(5) > 0 && c.flag(1) > 0 && c.streams() > 101);
    let keys = rt
        .block_on(async {
            ctx.sql(
                "SELECT (SELECT count(*) FROM (SELECT DISTINCT publisher, stream, sequence \
                 FROM t WHERE publisher IS NOT NULL)) AS keys, \
                 (SELECT count(*) FROM t WHERE publisher IS NOT NULL) AS keyed",
            )
            .await?
            .collect()
            .await
        })
        .unwrap();
    let n = |i: usize| keys[0].column(i).as_primitive::<Int64Type>().value(0) as u64;
    assert_eq!(c.distinct_keys(), n(0));
    assert_eq!(c.repeated_keys(), n(1) - n(0));
    assert!(c.repeated_keys() > 0, "keys repeat");
}
