//! The SQL scans behind a summary: the run's time span, the one scan of the stage columns
//! in time buckets, and the scan of the small columns.

use datafusion::arrow::array::{Array, AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::common::ScalarValue;
use datafusion::prelude::{SessionContext, ident};
use hoptrace_format::hist::SignedStats;
use hoptrace_format::schema::hop_column;
use hoptrace_format::spec::StageSpec;

use crate::AnalysisError;
use crate::session::stage_column;
use crate::stats::{self, TraceCounts};
use crate::weighted::WeightedStage;

pub(super) fn scalar(batch: &RecordBatch, name: &str) -> Result<ScalarValue, AnalysisError> {
    let col = batch
        .column_by_name(name)
        .ok_or_else(|| AnalysisError::Render(format!("internal: result column {name} missing")))?;
    Ok(ScalarValue::try_from_array(col, 0)?)
}

pub(super) fn as_i64(v: &ScalarValue) -> Option<i64> {
    match v {
        ScalarValue::Int64(x) => *x,
        ScalarValue::UInt64(x) => x.and_then(|x| i64::try_from(x).ok()),
        ScalarValue::Int32(x) => x.map(i64::from),
        ScalarValue::UInt32(x) => x.map(i64::from),
        ScalarValue::TimestampNanosecond(x, _) => *x,
        _ => None,
    }
}

pub(super) fn as_u64(v: &ScalarValue) -> u64 {
    as_i64(v).and_then(|x| u64::try_from(x).ok()).unwrap_or(0)
}

pub(super) async fn one_row(ctx: &SessionContext, sql: &str) -> Result<RecordBatch, AnalysisError> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let schema = batches
        .first()
        .map(RecordBatch::schema)
        .ok_or_else(|| AnalysisError::Render("internal: aggregate returned no batch".into()))?;
    Ok(datafusion::arrow::compute::concat_batches(
        &schema, &batches,
    )?)
}

/// The first and last publish stamps of the traces (or their intended times where the
/// first hop is missing), Unix ns, (0, 0) without traces, and whether every trace has
/// its first hop.
///
/// When every trace has its first hop, Parquet statistics answer without reading the
/// traces; otherwise the two columns are read.
pub(super) async fn time_span(
    ctx: &SessionContext,
    first_hop: &str,
    time_col: &str,
) -> Result<(i64, i64, bool), AnalysisError> {
    let row = one_row(
        ctx,
        &format!(
            "SELECT count(*) AS rows, count({first_hop}) AS stamped, \
             min({first_hop}) AS t_min, max({first_hop}) AS t_max FROM traces_raw"
        ),
    )
    .await?;
    let every_row = as_u64(&scalar(&row, "rows")?) == as_u64(&scalar(&row, "stamped")?);
    let row = if every_row {
        row
    } else {
        one_row(
            ctx,
            &format!("SELECT min({time_col}) AS t_min, max({time_col}) AS t_max FROM traces_raw"),
        )
        .await?
    };
    let t_min = as_i64(&scalar(&row, "t_min")?).unwrap_or(0);
    let t_max = as_i64(&scalar(&row, "t_max")?).unwrap_or(t_min);
    Ok((t_min, t_max, every_row))
}

/// One time bucket of the scan: its traces and every stage over them.
pub(super) struct BucketScan {
    /// Bucket index; `None` for traces without a time.
    pub(super) bucket: Option<i64>,
    pub(super) messages: u64,
    pub(super) metrics: u64,
    pub(super) stages: Vec<SignedStats>,
    /// Every stage weighted by metrics.
    pub(super) weighted: Vec<WeightedStage>,
}

/// The metrics every message of the run carried, when that is one number (read from the
/// files' statistics where they answer): then each stage per metric is its per-message
/// figures scaled ([`WeightedStage::scaled`]) and the scans compute no `per_metric`.
pub(super) async fn constant_metric_count(
    ctx: &SessionContext,
) -> Result<Option<u64>, AnalysisError> {
    let row = one_row(
        ctx,
        "SELECT count(*) AS rows, count(metric_count) AS counted, \
         min(metric_count) AS lo, max(metric_count) AS hi FROM traces_raw",
    )
    .await?;
    let (lo, hi) = (as_i64(&scalar(&row, "lo")?), as_i64(&scalar(&row, "hi")?));
    let every_row = as_u64(&scalar(&row, "rows")?) == as_u64(&scalar(&row, "counted")?);
    Ok(match (lo, hi) {
        (Some(lo), Some(hi)) if lo == hi && every_row => u64::try_from(lo).ok(),
        _ => None,
    })
}

/// The one scan of the stage columns: per time bucket of `bucket_ns` from `t_min`, the
/// traces, their metrics and [`SignedStats`] of every stage, and every stage per metric
/// (scaled from its figures when every message carried `constant_metrics`).
pub(super) async fn scan_buckets(
    stages: &[StageSpec],
    ctx: &SessionContext,
    time_col: &str,
    t_min: i64,
    bucket_ns: i64,
    constant_metrics: Option<u64>,
) -> Result<Vec<BucketScan>, AnalysisError> {
    if let Some(m) = constant_metrics {
        let raw = ctx.table("traces_raw").await?;
        let time = raw.parse_sql_expr(time_col)?;
        return scan_buckets_indexed(raw, stages, time, t_min, bucket_ns, m).await;
    }
    // Messages carry different numbers of metrics: per-metric figures are computed too.
    let df = ctx.table("traces").await?;
    let bucket = df
        .parse_sql_expr(&format!(
            "CAST(({time_col} - {t_min}) / {bucket_ns} AS BIGINT)"
        ))?
        .alias("b");
    let aggregates = trace_aggregates(&df, stages, None)?;
    let batches = df.aggregate(vec![bucket], aggregates)?.collect().await?;
    let mut out = Vec::new();
    for batch in &batches {
        let column = |name: &str| {
            batch.column_by_name(name).ok_or_else(|| {
                AnalysisError::Render(format!("internal: result column {name} missing"))
            })
        };
        let b = column("b")?.as_primitive::<Int64Type>();
        let messages = column("messages")?.as_primitive::<Int64Type>();
        let metrics = column("metrics")?.as_primitive::<Int64Type>();
        let stage_cols = (0..stages.len())
            .map(|i| Ok(column(&format!("s_{i}"))?.as_binary::<i32>()))
            .collect::<Result<Vec<_>, AnalysisError>>()?;
        let weighted_cols = (0..stages.len())
            .map(|i| Ok(column(&format!("w_{i}"))?.as_binary::<i32>()))
            .collect::<Result<Vec<_>, AnalysisError>>()?;
        for r in 0..batch.num_rows() {
            let u = |a: &Int64Array| {
                if a.is_valid(r) {
                    u64::try_from(a.value(r)).unwrap_or(0)
                } else {
                    0
                }
            };
            let figures: Vec<SignedStats> = stage_cols
                .iter()
                .map(|c| SignedStats::decode(c.value(r)))
                .collect::<Result<_, _>>()?;
            let weighted = weighted_cols
                .iter()
                .map(|c| weighted_stage(c.is_valid(r).then(|| c.value(r))))
                .collect::<Result<_, _>>()?;
            out.push(BucketScan {
                bucket: b.is_valid(r).then(|| b.value(r)),
                messages: u(messages),
                metrics: u(metrics),
                stages: figures,
                weighted,
            });
        }
    }
    Ok(out)
}

/// [`scan_buckets`] when every message carried `metrics`: one `bucket_stats` aggregate
/// over the raw stamps finds each bucket by its number instead of a `GROUP BY` hashing
/// every row's, and computes each stage's deltas itself.
pub(super) async fn scan_buckets_indexed(
    df: datafusion::dataframe::DataFrame,
    stages: &[StageSpec],
    time: datafusion::prelude::Expr,
    t_min: i64,
    bucket_ns: i64,
    metrics: u64,
) -> Result<Vec<BucketScan>, AnalysisError> {
    use datafusion::prelude::lit;
    let mut args = vec![time, lit(t_min), lit(bucket_ns)];
    for st in stages {
        args.push(ident(hop_column(&st.to)));
        args.push(ident(hop_column(&st.from)));
    }
    let scanned = one_binary(df, stats::bucket_stats_udaf().call(args), |bytes| {
        stats::BucketStats::decode(bytes)
    })
    .await?;
    Ok(scanned
        .iter()
        .map(|(b, cell)| BucketScan {
            bucket: b.and_then(|b| i64::try_from(b).ok()),
            messages: cell.messages,
            metrics: cell.messages * metrics,
            weighted: cell
                .stages
                .iter()
                .map(|f| WeightedStage::scaled(f, metrics))
                .collect(),
            stages: cell.stages.clone(),
        })
        .collect())
}

/// The aggregates every scan of the traces computes: `messages`, `s_<i>`, the
/// [`SignedStats`] of stage `i`, and unless every message carried `constant_metrics`,
/// `metrics` (their sum) and `w_<i>`, the stage's histograms and moments weighted by
/// `metric_count` (a [`WeightedStage`]). With a constant count, `metric_count` is not
/// read at all.
pub(super) fn trace_aggregates(
    df: &datafusion::dataframe::DataFrame,
    stages: &[StageSpec],
    constant_metrics: Option<u64>,
) -> Result<Vec<datafusion::prelude::Expr>, AnalysisError> {
    let per_metric = constant_metrics.is_none();
    let mut aggregates = vec![df.parse_sql_expr("count(*)")?.alias("messages")];
    if per_metric {
        aggregates.push(
            df.parse_sql_expr("sum(CAST(metric_count AS BIGINT))")?
                .alias("metrics"),
        );
    }
    let stage_stats = stats::stage_stats_udaf();
    let weighted = crate::weighted::per_metric_udaf();
    for (i, st) in stages.iter().enumerate() {
        aggregates.push(
            stage_stats
                .call(vec![ident(stage_column(&st.name))])
                .alias(format!("s_{i}")),
        );
        if per_metric {
            aggregates.push(
                weighted
                    .call(vec![ident(stage_column(&st.name)), ident("metric_count")])
                    .alias(format!("w_{i}")),
            );
        }
    }
    Ok(aggregates)
}

/// The figures of the small columns: flags, missing hops, streams and publishers.
pub(super) async fn scan_counts(ctx: &SessionContext) -> Result<TraceCounts, AnalysisError> {
    let df = ctx.table("traces_raw").await?;
    let complete = df.parse_sql_expr("status = 'complete'")?;
    let counts = stats::trace_counts_udaf().call(vec![
        ident("stream"),
        ident("publisher"),
        complete,
        ident("flags"),
        ident("missing_mask"),
        ident("sequence"),
    ]);
    one_binary(df, counts, TraceCounts::decode).await
}

/// The binary result of one aggregate `expr` over all of `df`, read by `decode`.
pub(super) async fn one_binary<T>(
    df: datafusion::dataframe::DataFrame,
    expr: datafusion::prelude::Expr,
    decode: impl FnOnce(&[u8]) -> datafusion::common::Result<T>,
) -> Result<T, AnalysisError> {
    let name = expr.schema_name().to_string();
    let batches = df
        .aggregate(vec![], vec![expr.alias("r")])?
        .collect()
        .await?;
    let bytes = batches
        .iter()
        .find(|b| b.num_rows() > 0)
        .and_then(|b| b.column_by_name("r"))
        .map(|c| c.as_binary::<i32>())
        .filter(|c| c.is_valid(0))
        .map(|c| c.value(0))
        .ok_or_else(|| AnalysisError::Render(format!("internal: {name} returned nothing")))?;
    Ok(decode(bytes)?)
}

/// A `per_metric` result: its stage, or an empty one for NULL.
pub(super) fn weighted_stage(bytes: Option<&[u8]>) -> Result<WeightedStage, AnalysisError> {
    bytes.map_or(Ok(WeightedStage::default()), |b| {
        WeightedStage::decode(b)
            .ok_or_else(|| AnalysisError::Render("internal: malformed per-metric state".into()))
    })
}
