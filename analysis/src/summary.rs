//! Everything a report says about a run, computed with SQL over the run's Parquet.
//!
//! Exact figures (count, min, max, mean, standard deviation) and HDR histograms (3
//! significant digits; each percentile with its precision, half its HDR bucket) come from
//! one grouped scan of the run with the `stage_stats` aggregate ([`crate::stats`]).
//! Negative stage deltas (clock error) are counted beside a stage and kept out of its
//! statistics, as the collector does. `summary.json` is a [`Summary`]
//! serialized; its JSON schema is `analysis/schema/summary.schema.json`.

use datafusion::common::ScalarValue;
use datafusion::prelude::SessionContext;
use hoptrace_format::hist::{MAX_TRACKABLE_NS, SIGNIFICANT_DIGITS, SignedStats, new_histogram};
use hoptrace_format::schema::hop_column;
use hoptrace_format::spec::StageSpec;
use hoptrace_format::units::duration_f64;
use serde::{Deserialize, Serialize};

use crate::AnalysisError;
use crate::bounds::{BoundFigures, BoundStages};
pub use crate::polled::{
    CostSpread, PollBracket, PolledEnd, PolledHop, StoreTapCost, poll_bracket, polled_hops,
};
use crate::session::{RunSet, quote_ident, stage_column};
use crate::weighted::WeightedStage;

pub use crate::figures::{CLOCK_WARN_FRACTION, Figures, Percentile, quantile_label};

mod accounting;
mod environment;
mod model;
mod scan;

use accounting::accounting;
pub use environment::clock_uncertainty;
use environment::environment;
pub use model::{
    AccountingSummary, DataRead, Environment, HostSummary, MAX_TIME_BUCKETS, Method, PerMetric,
    RunInfo, SCHEMA_VERSION, StageHistograms, StageSummary, Summary, Throughput, ThroughputBucket,
    Totals,
};
use scan::{
    as_i64, as_u64, constant_metric_count, one_row, scalar, scan_buckets, scan_counts, time_span,
    trace_aggregates, weighted_stage,
};

/// The per-metric figures of one stage from its weighted histograms and moments; the
/// percentiles kept within `figures`' exact minimum and maximum (the weighted values are
/// some of those values).
fn per_metric(w: &WeightedStage, figures: &SignedStats) -> PerMetric {
    PerMetric {
        count: w.pos.len() + w.neg.len(),
        mean_ns: w.moments.mean_ns(),
        stddev_ns: w.moments.stddev_ns(),
        percentiles: crate::bounds::weighted_percentiles(w, figures),
    }
}

/// Stage `i`'s bounds from the figures of every scanned stage.
fn stage_bounds(
    bs: &BoundStages,
    i: usize,
    figures: &[SignedStats],
    weighted: &[WeightedStage],
    per_metric: bool,
    spec: &hoptrace_format::spec::PipelineSpec,
) -> Option<crate::bounds::StageBounds> {
    let (lo, hi) = bs.of.get(i).copied().flatten()?;
    let st = &spec.stages[i];
    let hops = |j: usize| (bs.scan[j].from.clone(), bs.scan[j].to.clone());
    Some(crate::bounds::StageBounds {
        polled: [&st.from, &st.to]
            .into_iter()
            .filter(|h| spec.earliest_of(h).is_some())
            .cloned()
            .collect(),
        lower_hops: hops(lo),
        upper_hops: hops(hi),
        lower: BoundFigures::of(&figures[lo], per_metric.then(|| &weighted[lo])),
        upper: BoundFigures::of(&figures[hi], per_metric.then(|| &weighted[hi])),
    })
}

/// Computes the summary (and the charts' histograms) of `runs` with `ctx` (from
/// [`RunSet::session`]).
///
/// The run is read by two scans side by side: one of the columns every stage needs
/// (stamps, metrics), in time buckets, each bucket holding every stage's exact figures
/// and histogram (the whole run is their merge); one of the small columns (status,
/// flags, missing hops, streams, publishers). Before both, the first and last stamps
/// (which place the time buckets) come from Parquet statistics, and so does whether
/// every message carried the same number of metrics: then the per-metric figures are
/// the per-message ones scaled, `metric_count` is not read, and one `bucket_stats`
/// aggregate over the raw stamps does the first scan; otherwise a `GROUP BY` of the
/// time bucket computes the per-metric figures too.
///
/// # Errors
/// When a query fails (unreadable Parquet, a spec whose hops are not columns).
pub async fn compute(
    runs: &RunSet,
    ctx: &SessionContext,
) -> Result<(Summary, Vec<StageHistograms>), AnalysisError> {
    compute_with(runs, ctx, crate::tail::DEFAULT_EXEMPLARS).await
}

/// [`compute`] listing the `exemplars` slowest messages of each headline stage (at most
/// [`crate::tail::MAX_EXEMPLARS`]).
///
/// # Errors
/// As [`compute`], and when `exemplars` is too many.
pub async fn compute_with(
    runs: &RunSet,
    ctx: &SessionContext,
    exemplars: usize,
) -> Result<(Summary, Vec<StageHistograms>), AnalysisError> {
    let pipeline = runs.pipeline();
    let hops: Vec<String> = pipeline.hops.iter().map(|h| h.name.clone()).collect();
    let first_hop = quote_ident(&hop_column(&hops[0]));
    // A trace's time: its first hop's stamp, else its intended send time unless that was
    // implausible (flag 16), so one absurd record cannot stretch the run.
    let time_col = format!(
        "CAST(coalesce({first_hop}, CASE WHEN (flags & 16) = 0 THEN intended_ns END) AS BIGINT)"
    );

    let (t_min, t_max, every_row_stamped) = time_span(ctx, &first_hop, &time_col).await?;
    // Where every trace has its first hop, that is its time: the scan then reads
    // neither the intended times nor the flags for it.
    let time_col = if every_row_stamped {
        format!("CAST({first_hop} AS BIGINT)")
    } else {
        time_col
    };
    let duration_s = (t_max - t_min) as f64 / 1e9;
    let span_s = ((t_max - t_min) / 1_000_000_000 + 1).max(1);
    let bucket_s = (span_s + MAX_TIME_BUCKETS - 1) / MAX_TIME_BUCKETS;
    let bucket_ns = bucket_s * 1_000_000_000;
    let nbuckets = usize::try_from((t_max - t_min) / bucket_ns + 1).unwrap_or(1);

    let constant_metrics = constant_metric_count(ctx).await?;
    // The two scans read different columns of the same files: side by side, one's
    // reads warm the page cache for the other, and one's single-threaded end (merging
    // its partitions) overlaps the other's work.
    let bs = runs.bound_stages();
    // The components of the headline stages that are no stage of the spec are scanned too:
    // the tail attribution gives their figures over all messages.
    let tail_plans = crate::tail::plans(pipeline);
    let mut scan = bs.scan.clone();
    scan.extend(crate::tail::extra_stages(&tail_plans, &scan));
    let started = std::time::Instant::now();
    let (scanned, counts) = tokio::try_join!(
        scan_buckets(&scan, ctx, &time_col, t_min, bucket_ns, constant_metrics),
        scan_counts(ctx)
    )?;

    tracing::info!(
        "summary: the stamps' and the small columns' scans took {:.2} s",
        started.elapsed().as_secs_f64()
    );
    let rows: u64 = scanned.iter().map(|s| s.messages).sum();
    let metrics: u64 = scanned.iter().map(|s| s.metrics).sum();
    let rate = |n: u64| {
        if duration_s > 0.0 {
            n as f64 / duration_s
        } else {
            0.0
        }
    };

    let mut buckets: Vec<ThroughputBucket> = (0..nbuckets)
        .map(|b| ThroughputBucket {
            t_s: (b as i64 * bucket_s) as f64,
            messages: 0,
            metrics_per_s: 0.0,
        })
        .collect();
    let mut whole = vec![SignedStats::default(); scan.len()];
    let mut whole_weighted = vec![WeightedStage::default(); scan.len()];
    let mut by_time: Vec<Vec<Option<&SignedStats>>> =
        vec![vec![None; nbuckets]; pipeline.stages.len()];
    for s in &scanned {
        for (w, st) in whole.iter_mut().zip(&s.stages) {
            w.merge(st);
        }
        for (w, st) in whole_weighted.iter_mut().zip(&s.weighted) {
            w.merge(st);
        }
        let Some(b) = s.bucket.and_then(|b| usize::try_from(b).ok()) else {
            continue;
        };
        let Some(slot) = buckets.get_mut(b) else {
            continue;
        };
        slot.messages = s.messages;
        slot.metrics_per_s = s.metrics as f64 / bucket_s as f64;
        for (stage, st) in by_time.iter_mut().zip(&s.stages) {
            stage[b] = Some(st);
        }
    }

    let env = environment(runs);
    let polled = polled_hops(runs, ctx).await?;
    let mut stages = Vec::new();
    let mut hists = Vec::new();
    let mut warnings: Vec<String> = runs
        .runs
        .iter()
        .flat_map(|r| r.summary.clock_alerts.iter())
        .map(|a| format!("clock preflight failed: {a}"))
        .collect();
    for h in &env.hosts {
        if let Some(leap) = &h.leap_pending {
            warnings.push(format!(
                "{}: its clock announced a leap second ({leap}) at the end of the UTC day: stamps taken across it can be 1 s apart from those of other hosts",
                h.host
            ));
        }
    }
    warnings.extend(runs.runs.iter().filter(|r| r.summary.interrupted).map(|r| {
        format!(
            "run {} was interrupted (Ctrl-C): it covers less load than was planned",
            r.summary.run_id
        )
    }));
    let per_metric_run = metrics > rows;
    for (i, (((st, figures), weighted), cells)) in pipeline
        .stages
        .iter()
        .zip(&whole)
        .zip(&whole_weighted)
        .zip(&by_time)
        .enumerate()
    {
        let hist = figures.pos.to_histogram();
        let mut summary = stage_summary(st, figures, weighted, &env.hosts, &polled);
        summary.bounds = stage_bounds(&bs, i, &whole, &whole_weighted, per_metric_run, pipeline);
        if summary.figures.count == 0 {
            // Said once; nothing else about it (no uncertainty against a P50 it has not).
            warnings.push(format!(
                "{}: no values: no trace had both {} and {} stamped",
                st.name, st.from, st.to
            ));
        }
        if let Some(b) = summary.poll_bracket.as_ref().filter(|b| b.warning) {
            warnings.push(format!(
                "{}: the poll bracket of {} (P99 {}, mean {}, max {}) is not small against its P50 {}: the {} stamp is late by up to that much (to narrow it: poll more often or with more pollers, make each poll read fewer series or rows, or let the store notify each row, `notify=` on PostgreSQL)",
                st.name,
                b.hop,
                hoptrace_format::units::duration_ns(b.p99_ns),
                hoptrace_format::units::duration_ns(b.mean_ns.round() as u64),
                hoptrace_format::units::duration_ns(b.max_ns),
                summary
                    .figures.percentiles
                    .first()
                    .map_or_else(|| "-".into(), |p| hoptrace_format::units::signed_ns(p.value_ns)),
                b.hop
            ));
        }
        if let Some(w) = notified_in_one_poll_stage(st, &summary.column, &polled) {
            warnings.push(w);
        }
        if summary.clock_warning {
            warnings.push(format!(
                "{}: clock uncertainty {} is not small against its P50 {}",
                st.name,
                summary
                    .clock_uncertainty_ns
                    .map_or_else(|| "unknown".into(), hoptrace_format::units::duration_ns),
                summary.figures.percentiles.first().map_or_else(
                    || "-".into(),
                    |p| hoptrace_format::units::signed_ns(p.value_ns)
                )
            ));
        }
        if summary.figures.negative > 0 {
            warnings.push(format!(
                "{}: {} negative deltas (clock error between hosts); flagged, and counted in every figure of the stage",
                st.name, summary.figures.negative
            ));
        }
        stages.push(summary);
        hists.push(StageHistograms {
            name: st.name.clone(),
            whole: hist,
            max_ns: figures.max_ns().unwrap_or(0),
            by_time: cells
                .iter()
                .map(|c| c.map_or_else(new_histogram, |c| c.pos.to_histogram()))
                .collect(),
        });
    }

    let events = crate::events::all_events(runs.runs.iter().map(|r| &r.summary), ctx).await?;
    let mut tails = crate::tail::attribution(
        ctx,
        &tail_plans,
        &scan,
        &whole,
        (&time_col, t_min),
        exemplars,
        &events,
    )
    .await?;
    for c in tails
        .iter_mut()
        .flat_map(|t| t.levels.iter_mut())
        .filter_map(|l| l.concentration.as_mut())
    {
        c.mark_events(&events, t_min);
    }
    let accounting = accounting(runs, rows, &counts, &hops);
    if !accounting.adds_up {
        warnings.push(format!(
            "counts do not add up: {}",
            accounting.discrepancies.join("; ")
        ));
    }
    let files = runs.part_files();
    let bytes = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let summary = Summary {
        schema_version: SCHEMA_VERSION,
        generated_by: format!("hoptrace {}", env!("CARGO_PKG_VERSION")),
        runs: runs
            .runs
            .iter()
            .map(|r| RunInfo {
                run_id: r.summary.run_id.clone(),
                dir: r.dir.display().to_string(),
                started_unix_ns: r.summary.started_unix_ns,
                ended_unix_ns: r.summary.ended_unix_ns,
                interrupted: r.summary.interrupted,
                restarts: r.summary.restarts.clone(),
            })
            .collect(),
        pipeline: pipeline.name.clone(),
        method: Method {
            histogram: "HdrHistogram (hdrhistogram v7, Rust)".into(),
            significant_digits: SIGNIFICANT_DIGITS,
            max_relative_error: 0.5 * 10f64.powi(-i32::from(SIGNIFICANT_DIGITS)),
            highest_trackable_ns: MAX_TRACKABLE_NS,
            rank: "value of rank max(1, ceil(q * n)) in ascending order, reported as the middle of its HDR bucket".into(),
            signs: "every known delta, negative ones (clock error) included: values >= 0 in one HDR histogram, magnitudes of negative values in a second one of the same layout; count, min, max, mean, standard deviation and percentiles cover both".into(),
        },
        data: DataRead {
            files: files.len() as u64,
            bytes,
            rows,
        },
        totals: Totals {
            messages: rows,
            metrics,
            duration_s,
            messages_per_s: rate(rows),
            metrics_per_s: rate(metrics),
            streams: counts.streams(),
            publishers: counts.publishers(),
        },
        stages,
        accounting,
        environment: env,
        throughput: Throughput {
            bucket_s: bucket_s as f64,
            start_unix_ns: t_min,
            buckets,
        },
        warnings,
        store_taps: polled.iter().flat_map(|p| p.taps.iter().cloned()).collect(),
        tails,
        events,
    };
    Ok((summary, hists))
}

/// Every stage over a measurement window of a run: the traces whose intended send time
/// lies in `[from_unix_ns, to_unix_ns)`. An open-loop load is judged by when messages
/// were due, not when they went out, so a stalled publisher cannot hide its backlog.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WindowSummary {
    /// Window start, Unix ns (inclusive).
    pub from_unix_ns: i64,
    /// Window end, Unix ns (exclusive).
    pub to_unix_ns: i64,
    /// Traces due in the window.
    pub messages: u64,
    /// Of those, complete.
    pub complete: u64,
    /// Metrics they carried.
    pub metrics: u64,
    /// One per stage of the pipeline, in its order, over the window's traces.
    pub stages: Vec<StageSummary>,
}

impl WindowSummary {
    /// Window length, seconds.
    #[must_use]
    pub fn length_s(&self) -> f64 {
        (self.to_unix_ns - self.from_unix_ns) as f64 / 1e9
    }

    /// A stage by name.
    #[must_use]
    pub fn stage(&self, name: &str) -> Option<&StageSummary> {
        self.stages.iter().find(|s| s.name == name)
    }
}

/// The figures of `runs` over a window that starts `skip_ns` after the first intended
/// send time and lasts `length_ns` (a warm-up left out, then a fixed measured window).
///
/// # Errors
/// When a query fails.
pub async fn window(
    runs: &RunSet,
    ctx: &SessionContext,
    skip_ns: i64,
    length_ns: i64,
) -> Result<WindowSummary, AnalysisError> {
    let pipeline = runs.pipeline();
    let first = one_row(
        ctx,
        "SELECT min(CAST(intended_ns AS BIGINT)) AS t0 FROM traces_raw",
    )
    .await?;
    let t0 = as_i64(&scalar(&first, "t0")?).unwrap_or(0);
    let (from, to) = (t0 + skip_ns, t0 + skip_ns + length_ns);
    let df = ctx.table("traces").await?;
    let due = df.parse_sql_expr(&format!(
        "CAST(intended_ns AS BIGINT) >= {from} AND CAST(intended_ns AS BIGINT) < {to}"
    ))?;
    let df = df.filter(due)?;
    let constant_metrics = constant_metric_count(ctx).await?;
    let bs = runs.bound_stages();
    let mut aggregates = trace_aggregates(&df, &bs.scan, constant_metrics)?;
    aggregates.push(
        df.parse_sql_expr("sum(CASE WHEN status = 'complete' THEN 1 ELSE 0 END)")?
            .alias("complete"),
    );
    let batches = df.aggregate(vec![], aggregates)?.collect().await?;
    let batch = batches.iter().find(|b| b.num_rows() > 0).ok_or_else(|| {
        AnalysisError::Render("internal: window aggregate returned nothing".into())
    })?;
    let env = environment(runs);
    let polled = polled_hops(runs, ctx).await?;
    let mut all_figures = Vec::with_capacity(bs.scan.len());
    let mut all_weighted = Vec::with_capacity(bs.scan.len());
    for i in 0..bs.scan.len() {
        let figures = scalar(batch, &format!("s_{i}"))?;
        let figures = match figures {
            ScalarValue::Binary(Some(b)) => SignedStats::decode(&b)
                .map_err(|e| AnalysisError::Render(format!("internal: {e}")))?,
            _ => SignedStats::default(),
        };
        let binary = |name: String| -> Result<Option<Vec<u8>>, AnalysisError> {
            Ok(match scalar(batch, &name)? {
                ScalarValue::Binary(b) => b,
                _ => None,
            })
        };
        let weighted = match constant_metrics {
            Some(m) => WeightedStage::scaled(&figures, m),
            None => weighted_stage(binary(format!("w_{i}"))?.as_deref())?,
        };
        all_figures.push(figures);
        all_weighted.push(weighted);
    }
    let mut stages = Vec::new();
    for (i, st) in pipeline.stages.iter().enumerate() {
        let mut summary = stage_summary(st, &all_figures[i], &all_weighted[i], &env.hosts, &polled);
        summary.bounds = stage_bounds(
            &bs,
            i,
            &all_figures,
            &all_weighted,
            constant_metrics.is_none_or(|m| m > 1),
            pipeline,
        );
        stages.push(summary);
    }
    let messages = as_u64(&scalar(batch, "messages")?);
    Ok(WindowSummary {
        from_unix_ns: from,
        to_unix_ns: to,
        messages,
        complete: as_u64(&scalar(batch, "complete")?),
        metrics: match constant_metrics {
            Some(m) => messages * m,
            None => as_u64(&scalar(batch, "metrics")?),
        },
        stages,
    })
}

/// A stage's summary from its figures over every known delta.
fn stage_summary(
    st: &StageSpec,
    figures: &SignedStats,
    weighted: &WeightedStage,
    hosts: &[HostSummary],
    polled: &[PolledHop],
) -> StageSummary {
    let (uncertainty, note) = clock_uncertainty(hosts, &st.from, &st.to);
    let p50 = figures.percentile(0.5).map(|p| p.value_ns);
    // A stage without values has nothing for an uncertainty to be large against.
    let clock_warning = match (uncertainty, p50) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(u), Some(p50)) => u as f64 > CLOCK_WARN_FRACTION * p50.unsigned_abs() as f64,
    };
    StageSummary {
        name: st.name.clone(),
        column: stage_column(&st.name),
        from: st.from.clone(),
        to: st.to.clone(),
        definition: st.definition.clone(),
        headline: st.headline,
        figures: figures.figures(),
        clock_uncertainty_ns: uncertainty,
        clock_note: note,
        clock_warning,
        poll_bracket: poll_bracket(polled, &st.from, &st.to, p50),
        per_metric: Some(per_metric(weighted, figures)),
        bounds: None,
    }
}

/// A statistic of a stage, ns, its percentiles per metric when `per_metric` and the stage
/// has them.
#[must_use]
pub fn stat_counted(s: &StageSummary, name: &str, per_metric: bool) -> Option<f64> {
    match name {
        "min" => s.figures.min_ns.map(|v| v as f64),
        "max" => s.figures.max_ns.map(|v| v as f64),
        "mean" => s.figures.mean_ns,
        p => s
            .counted(per_metric)
            .1
            .iter()
            .find(|q| q.is(p))
            .map(|p| p.value_ns as f64),
    }
}

impl StageSummary {
    /// The interval a statistic of the stage (`p99`, `min`, `max`, `mean`) lies in, ns:
    /// its bounds where a hop of the stage is polled, its value otherwise, widened by the
    /// stage's clock uncertainty when known. `None` without values.
    #[must_use]
    pub fn stat_interval(&self, name: &str, per_metric: bool) -> Option<(f64, f64)> {
        let point = stat_counted(self, name, per_metric)?;
        let (lo, hi) = match &self.bounds {
            Some(b) => (
                b.lower.stat(name, per_metric).unwrap_or(point),
                b.upper.stat(name, per_metric).unwrap_or(point),
            ),
            None => (point, point),
        };
        let u = self.clock_uncertainty_ns.unwrap_or(0) as f64;
        Some((lo.min(point) - u, hi.max(point) + u))
    }

    /// `[lower, upper]` of the statistic a table's row or column shows (`Min`, `P99`,
    /// `Max`, `Mean`): [`Self::stat_interval`] as text, with `+ clock unknown` when a
    /// host's clock sent no status; `None` for a stage without bounds or a label that is
    /// not such a statistic.
    #[must_use]
    pub fn bounds_text(&self, label: &str, per_metric: bool) -> Option<String> {
        self.bounds.as_ref()?;
        let name = match label {
            "Min" => "min".to_owned(),
            "Max" => "max".to_owned(),
            "Mean" => "mean".to_owned(),
            l if l.starts_with('P') => l.to_ascii_lowercase(),
            _ => return None,
        };
        let (lo, hi) = self.stat_interval(&name, per_metric)?;
        Some(format!(
            "[{}, {}]{}",
            duration_f64(lo),
            duration_f64(hi),
            if self.clock_uncertainty_ns.is_none() {
                " + clock unknown"
            } else {
                ""
            }
        ))
    }

    /// `text` followed by the bounds of the statistic `label` names, when the stage has
    /// them ([`Self::bounds_text`]): `122.2ms [41.9ms, 122.2ms]`, or `text` alone.
    #[must_use]
    pub fn with_bounds(&self, text: String, label: &str, per_metric: bool) -> String {
        match self.bounds_text(label, per_metric) {
            Some(b) => format!("{text} {b}"),
            None => text,
        }
    }
}

/// A stage between two stamps of one poll (`query_start → queryable`) is 0 for the keys
/// a store's notification found first (no query found them): said, with how many.
fn notified_in_one_poll_stage(
    st: &StageSpec,
    column: &str,
    polled: &[crate::polled::PolledHop],
) -> Option<String> {
    let h = polled.iter().find(|h| {
        st.from != st.to && h.same_poll.contains(&st.from) && h.same_poll.contains(&st.to)
    })?;
    let notified: u64 = h
        .taps
        .iter()
        .filter_map(|t| t.notified.as_ref())
        .map(|n| n.keys)
        .sum();
    (notified > 0).then(|| {
        format!(
            "{}: {} keys came first by the store's notification, not a poll: their {} and {} are one instant (no query), so the stage counts them as 0 beside the polls' durations (`WHERE {column} > 0` in `hoptrace sql` keeps the polls' own)",
            st.name,
            hoptrace_format::units::count(notified),
            st.from,
            st.to
        )
    })
}

#[cfg(test)]
mod tests;
