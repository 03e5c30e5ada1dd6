use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, FixedSizeBinaryArray, Int64Array, UInt64Array};
use hoptrace_format::hist::{hdr_index, hdr_value};

use super::*;

#[test]
fn plans_and_extra_stages_cover_every_component_once() {
    let spec = PipelineSpec::default_pipeline();
    let plans = plans(&spec);
    // Query Duration (two consecutive hops) does not split.
    assert_eq!(plans.len(), 1);
    assert_eq!(spec.stages[plans[0].stage].name, "Total Ingestion");
    let extra = extra_stages(&plans, &spec.stages);
    assert_eq!(extra.len(), 1);
    assert_eq!(
        (extra[0].from.as_str(), extra[0].to.as_str()),
        ("store_in", "query_start")
    );
    let mut scan = spec.stages.clone();
    scan.extend(extra);
    assert!(extra_stages(&plans, &scan).is_empty());
}

#[test]
fn the_slowest_bucket_is_found_by_rank() {
    let mut s = SignedStats::default();
    s.add_values(&(1..=1000).collect::<Vec<i64>>());
    assert_eq!(floor_at_rank(&s, 1000), Some(1000));
    assert_eq!(floor_at_rank(&s, 991), Some(991));
    assert_eq!(floor_at_rank(&s, 1), Some(1));
    assert_eq!(floor_at_rank(&s, 0), Some(1));
}

#[test]
fn the_default_total_ingestion_splits_into_five_components_that_chain() {
    let spec = PipelineSpec::default_pipeline();
    let total = spec
        .stages
        .iter()
        .find(|s| s.name == "Total Ingestion")
        .unwrap();
    let c = components(&spec, total);
    let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "Broker Time",
            "Flow Internal",
            "Transmission",
            "store_in → query_start",
            "Query Duration"
        ]
    );
    assert!(c.windows(2).all(|w| w[0].to == w[1].from));
    assert_eq!(
        (c[0].from.as_str(), c[4].to.as_str()),
        ("publish", "queryable")
    );
    assert!(!c[3].spec_stage && c[4].spec_stage);
    // Nothing splits a stage between consecutive hops.
    let query = spec
        .stages
        .iter()
        .find(|s| s.name == "Query Duration")
        .unwrap();
    assert_eq!(components(&spec, query).len(), 1);
}

#[test]
fn a_hop_holding_an_earliest_instant_is_not_on_the_way() {
    let spec = PipelineSpec::from_toml_str(
        r#"name = "p"
[[hops]]
name = "publish"
[[hops]]
name = "queryable_earliest"
[[hops]]
name = "query_start"
[[hops]]
name = "queryable"
earliest = "queryable_earliest"
[[stages]]
name = "Total"
from = "publish"
to = "queryable"
definition = "t"
headline = true
[[stages]]
name = "Query"
from = "query_start"
to = "queryable"
definition = "q"
"#,
    )
    .unwrap();
    let c = components(&spec, &spec.stages[0]);
    let hops: Vec<(&str, &str)> = c.iter().map(|c| (c.from.as_str(), c.to.as_str())).collect();
    assert_eq!(
        hops,
        [("publish", "query_start"), ("query_start", "queryable")]
    );
    assert_eq!(c[1].name, "Query");
}

#[test]
fn the_floor_is_the_lowest_value_of_the_percentiles_bucket() {
    let mut r = 0x2545_f491_u64;
    let mut values: Vec<i64> = (0..50_000)
        .map(|_| {
            r = r.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let v = ((r >> 33) % 40_000_000) as i64;
            if (r >> 20).is_multiple_of(10) {
                -v / 1000
            } else {
                v
            }
        })
        .collect();
    let mut s = SignedStats::default();
    s.add_values(&values);
    values.sort_unstable();
    for q in [0.01, 0.5, 0.99, 0.999, 0.9999, 1.0] {
        let exact = values[usize::try_from(rank(q, values.len() as u64)).unwrap() - 1];
        let lowest = if exact >= 0 {
            hdr_value(hdr_index(exact as u64)) as i64
        } else {
            let m = exact.unsigned_abs();
            let i = hdr_index(m);
            -((hdr_value(i) + hoptrace_format::hist::hdr_width(i) - 1) as i64)
        };
        assert_eq!(floor(&s, q), Some(lowest), "q {q}");
        let tail = values.iter().filter(|&&v| v >= lowest).count() as u64;
        assert!(tail >= fewest_in_tail(q, values.len() as u64), "q {q}");
    }
    assert_eq!(floor(&SignedStats::default(), 0.99), None);
}

/// A batch of `tail_stats` arguments: `stamps[row][hop]`, `None` for a missing stamp.
/// Row `i` is message `first + i` (sequence; stream its remainder by 7).
fn batch_from(
    first: u64,
    exemplars: i64,
    thresholds: [i64; 3],
    stamps: &[Vec<Option<i64>>],
) -> Vec<ArrayRef> {
    let n = stamps.len();
    let keys = first..first + n as u64;
    let lit = |v: i64| Arc::new(Int64Array::from(vec![v; n])) as ArrayRef;
    let mut out = vec![lit(exemplars)];
    out.extend(thresholds.map(lit));
    out.push(Arc::new(Int64Array::from(
        stamps.iter().map(|s| s[0]).collect::<Vec<_>>(),
    )));
    out.push(Arc::new(UInt64Array::from(vec![3_u64; n])));
    out.push(Arc::new(UInt64Array::from(
        keys.clone().map(|i| i % 7).collect::<Vec<_>>(),
    )));
    out.push(Arc::new(UInt64Array::from(
        keys.clone().collect::<Vec<_>>(),
    )));
    out.push(Arc::new(
        FixedSizeBinaryArray::try_from_sparse_iter_with_size(
            keys.map(|i| i.is_multiple_of(2).then_some([i as u8; 16])),
            16,
        )
        .unwrap(),
    ));
    for h in 0..stamps[0].len() {
        out.push(Arc::new(Int64Array::from(
            stamps.iter().map(|s| s[h]).collect::<Vec<_>>(),
        )));
    }
    out
}

fn batch(exemplars: i64, thresholds: [i64; 3], stamps: &[Vec<Option<i64>>]) -> Vec<ArrayRef> {
    batch_from(0, exemplars, thresholds, stamps)
}

/// Three components of 1 ms each, except every 100th message, whose second component
/// took 50 ms, and message 43's too (101 slow messages: the value of the P99's rank is a
/// slow one); message 5 misses its middle hop.
fn slow_middle(rows: usize) -> Vec<Vec<Option<i64>>> {
    (0..rows)
        .map(|i| {
            let t0 = 1_000_000_000 + i as i64 * 10_000;
            let mid = if i % 100 == 42 || i == 43 {
                50_000_000
            } else {
                1_000_000
            };
            let t1 = t0 + 1_000_000;
            let t2 = t1 + mid;
            let t3 = t2 + 1_000_000;
            vec![Some(t0), (i != 5).then_some(t1), Some(t2), Some(t3)]
        })
        .collect()
}

fn chain() -> Vec<Component> {
    ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, n)| Component {
            name: (*n).into(),
            from: format!("h{i}"),
            to: format!("h{}", i + 1),
            spec_stage: true,
        })
        .collect()
}

/// The figures of hops `from -> to` over the messages with both.
fn figures(stamps: &[Vec<Option<i64>>], from: usize, to: usize) -> SignedStats {
    let mut s = SignedStats::default();
    s.add_values(
        &stamps
            .iter()
            .filter_map(|x| Some(x[to]? - x[from]?))
            .collect::<Vec<_>>(),
    );
    s
}

/// [`TailStats::attribution`] of stage `h0 -> h3` of `stamps` at `levels`.
fn attribute(
    st: &TailStats,
    stamps: &[Vec<Option<i64>>],
    levels: &[(usize, Percentile)],
) -> TailAttribution {
    let head = figures(stamps, 0, 3);
    let parts: Vec<SignedStats> = (0..3).map(|i| figures(stamps, i, i + 1)).collect();
    let refs: Vec<&SignedStats> = parts.iter().collect();
    st.attribution(("total", &head), (chain(), &refs), levels, vec![])
}

#[test]
fn the_component_that_made_the_tail_slow_takes_its_share() {
    let stamps = slow_middle(10_000);
    let head = figures(&stamps, 0, 3);
    let t99 = floor(&head, 0.99).unwrap();
    let mut st = TailStats::default();
    st.update(&batch(5, [t99, i64::MAX, i64::MAX], &stamps))
        .unwrap();
    let a = attribute(&st, &stamps, &[(0, head.percentile(0.99).unwrap())]);
    assert_eq!(a.messages, 10_000);
    let l = &a.levels[0];
    // The 101 slow messages and nothing else.
    assert_eq!((l.messages, l.with_components), (101, 101));
    let (dominant, share) = a.dominant(l).unwrap();
    assert_eq!(dominant.name, "b");
    assert!((share - 50.0 / 52.0).abs() < 1e-9, "{share}");
    let b = &l.components[1];
    // Over all messages, each component is over those with its hops (message 5 lacks
    // one): the shares of the excess add up to 1 within that one message's weight.
    assert!((b.share_of_excess.unwrap() - 1.0).abs() < 1e-3);
    assert!(l.components[0].share_of_excess.unwrap().abs() < 1e-3);
    assert!((b.times_median.unwrap() - 50.0).abs() < 0.1);
    let shares: f64 = l.components.iter().map(|c| c.share.unwrap()).sum();
    assert!((shares - 1.0).abs() < 1e-9);
    // The five slowest: slow messages, equal deltas, in key order.
    assert_eq!(a.exemplars.len(), 5);
    assert!(a.exemplars.iter().all(|e| e.delta_ns == 52_000_000));
    let seqs: Vec<u64> = a.exemplars.iter().map(|e| e.sequence).collect();
    let mut sorted = seqs.clone();
    sorted.sort_by_key(|&s| (s % 7, s));
    assert_eq!(seqs, sorted);
    let e = &a.exemplars[0];
    assert_eq!(
        e.components_ns,
        [Some(1_000_000), Some(50_000_000), Some(1_000_000)]
    );
    assert_eq!(
        e.otel_trace_id.is_some(),
        e.sequence.is_multiple_of(2),
        "the trace id travels with its message"
    );
}

#[test]
fn halves_merged_and_encoded_equal_the_whole() {
    let stamps = slow_middle(4_000);
    // Thresholds as a filter would pass them: every row is compared again.
    let args =
        |first, s: &[Vec<Option<i64>>]| batch_from(first, 7, [52_000_000, 1_000_000, i64::MAX], s);
    let mut whole = TailStats::default();
    whole.update(&args(0, &stamps)).unwrap();
    let (x, y) = stamps.split_at(1_234);
    let (mut a, mut b) = (TailStats::default(), TailStats::default());
    a.update(&args(0, x)).unwrap();
    b.update(&args(1_234, y)).unwrap();
    let mut merged = TailStats::decode(&TailStats::default().encode()).unwrap();
    merged.merge(&TailStats::decode(&a.encode()).unwrap());
    merged.merge(&TailStats::decode(&b.encode()).unwrap());
    let p = |s: &TailStats| {
        attribute(
            s,
            &stamps,
            &[
                (
                    0,
                    Percentile {
                        quantile: 0.99,
                        value_ns: 0,
                        precision_ns: 0,
                    },
                ),
                (
                    1,
                    Percentile {
                        quantile: 0.999,
                        value_ns: 0,
                        precision_ns: 0,
                    },
                ),
            ],
        )
    };
    let (w, m) = (p(&whole), p(&merged));
    assert_eq!(w.exemplars, m.exemplars);
    assert_eq!(w.levels.len(), 2);
    for (lw, lm) in w.levels.iter().zip(&m.levels) {
        assert_eq!(
            (lw.messages, lw.with_components),
            (lm.messages, lm.with_components)
        );
        for (cw, cm) in lw.components.iter().zip(&lm.components) {
            assert_eq!(cw.median, cm.median);
            assert!((cw.mean_ns.unwrap() - cm.mean_ns.unwrap()).abs() < 1e-6);
        }
    }
    assert!(TailStats::decode(&[TAIL_TAG, 1]).is_err());
    assert!(TailStats::decode(b"junk").is_err());
}

#[test]
fn absurd_exemplar_counts_are_refused_by_name() {
    let stamps = slow_middle(10);
    let mut st = TailStats::default();
    let e = st
        .update(&batch(MAX_EXEMPLARS as i64 + 1, [0, 0, 0], &stamps))
        .unwrap_err();
    assert!(e.to_string().contains("exemplars"), "{e}");
    let e = st.update(&batch(-1, [0, 0, 0], &stamps)).unwrap_err();
    assert!(e.to_string().contains("exemplars"), "{e}");
}

#[test]
fn a_run_without_a_message_of_both_ends_says_so() {
    let spec = PipelineSpec::default_pipeline();
    let hops: Vec<String> = spec.hops.iter().map(|h| h.name.clone()).collect();
    let ctx = SessionContext::new();
    ctx.register_batch(
        "traces_raw",
        datafusion::arrow::array::RecordBatch::new_empty(hoptrace_format::schema::traces_schema(
            &hops,
        )),
    )
    .unwrap();
    let plans = plans(&spec);
    let mut scan = spec.stages.clone();
    scan.extend(extra_stages(&plans, &scan));
    let figures = vec![SignedStats::default(); scan.len()];
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let t = rt
        .block_on(attribution(
            &ctx,
            &plans,
            &scan,
            &figures,
            ("publish_ns", 0),
            20,
            &[],
        ))
        .unwrap();
    assert_eq!(t.len(), 1);
    assert!(t[0].levels.is_empty() && t[0].exemplars.is_empty());
    assert_eq!(
        t[0].notes,
        ["no message has both publish and queryable: there is no tail to attribute"]
    );
    let e = rt
        .block_on(attribution(
            &ctx,
            &plans,
            &scan,
            &figures,
            ("publish_ns", 0),
            MAX_EXEMPLARS + 1,
            &[],
        ))
        .unwrap_err();
    assert!(e.to_string().contains("at most"), "{e}");
}
