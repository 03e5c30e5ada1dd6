use datafusion::arrow::array::RecordBatch;

use super::*;

fn host(name: &str, hops: &[&str], bound: Option<u64>) -> HostSummary {
    HostSummary {
        host: name.into(),
        addresses: vec![],
        hops: hops.iter().map(|s| (*s).to_owned()).collect(),
        processes: vec![],
        clock_sources: vec!["chrony".into()],
        clock_samples: 1,
        synced: true,
        max_error_bound_ns: bound,
        max_abs_offset_ns: Some(0),
        leap_pending: None,
    }
}

/// The span comes from the first hop's statistics when every trace has it, and from
/// the intended times of the others when not.
#[test]
fn the_span_falls_back_to_intended_times() {
    use std::sync::Arc;

    use datafusion::arrow::array::TimestampNanosecondArray;
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use datafusion::datasource::MemTable;

    let ts = || DataType::Timestamp(TimeUnit::Nanosecond, None);
    let schema = Arc::new(Schema::new(vec![
        Field::new("publish_ns", ts(), true),
        Field::new("intended_ns", ts(), false),
    ]));
    let span = |publish: Vec<Option<i64>>, intended: Vec<i64>| {
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(TimestampNanosecondArray::from(publish)),
                Arc::new(TimestampNanosecondArray::from(intended)),
            ],
        )
        .unwrap();
        let ctx = SessionContext::new();
        let table = MemTable::try_new(schema.clone(), vec![vec![batch]]).unwrap();
        ctx.register_table("traces_raw", Arc::new(table)).unwrap();
        let first = quote_ident("publish_ns");
        let time_col = format!("CAST(coalesce({first}, intended_ns) AS BIGINT)");
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(time_span(&ctx, &first, &time_col))
            .map(|(a, b, _)| (a, b))
            .unwrap()
    };
    assert_eq!(span(vec![Some(12), Some(30)], vec![10, 20]), (12, 30));
    assert_eq!(span(vec![None, Some(12), None], vec![5, 10, 40]), (5, 40));
    assert_eq!(span(vec![], vec![]), (0, 0));
}

#[test]
fn labels() {
    let l: Vec<String> = hoptrace_format::hist::QUANTILES
        .iter()
        .map(|&q| quantile_label(q))
        .collect();
    assert_eq!(l, ["P50", "P90", "P95", "P99", "P99.9", "P99.99"]);
}

#[test]
fn one_host_has_no_clock_uncertainty() {
    let hosts = [host("a", &["publish", "flow_in"], Some(5_000))];
    assert_eq!(clock_uncertainty(&hosts, "publish", "flow_in").0, Some(0));
}

#[test]
fn two_hosts_sum_their_bounds() {
    let hosts = [
        host("a", &["publish"], Some(5_000)),
        host("b", &["flow_in"], Some(7_000)),
    ];
    let (u, note) = clock_uncertainty(&hosts, "publish", "flow_in");
    assert_eq!(u, Some(12_000));
    assert!(note.contains("a + b"), "{note}");
}

#[test]
fn a_host_without_clock_status_is_unknown() {
    let hosts = [
        host("a", &["publish"], Some(5_000)),
        host("b", &["flow_in"], None),
    ];
    let (u, note) = clock_uncertainty(&hosts, "publish", "flow_in");
    assert_eq!(u, None);
    assert!(note.contains('b'), "{note}");
}
