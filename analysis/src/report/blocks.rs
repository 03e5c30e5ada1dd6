//! A summary as report blocks: highlights, environment, stage definitions and statistics,
//! the store taps' cost, throughput and accounting, in the reference report's order.

use crate::charts::Chart;
use crate::summary::{CostSpread, PollBracket, PolledEnd, StageSummary, StoreTapCost, Summary};
use hoptrace_format::units::{
    count, duration_f64, duration_ns, precision_ns, rate, signed_ns, span_s,
};

use super::block::Block;

pub(super) fn stat_rows(s: &StageSummary, per_metric: bool) -> Vec<Vec<String>> {
    let exact = |v: Option<String>| vec![v.unwrap_or_else(|| "-".into()), "exact".into()];
    let (n, percentiles) = s.counted(per_metric);
    let exact_note = if per_metric {
        "exact, per message"
    } else {
        "exact"
    };
    let exact = |v: Option<String>| {
        let mut r = exact(v);
        r[1] = exact_note.into();
        r
    };
    let mut rows = vec![
        vec![
            "Count".into(),
            count(n),
            if per_metric {
                format!("metrics ({} messages)", count(s.figures.count))
            } else {
                "—".into()
            },
        ],
        [
            vec!["Min".to_owned()],
            exact(s.figures.min_ns.map(|v| duration_f64(v as f64))),
        ]
        .concat(),
        [
            vec!["Max".to_owned()],
            exact(s.figures.max_ns.map(|v| duration_f64(v as f64))),
        ]
        .concat(),
    ];
    // Per metric when the summary has the weighted moments (summaries written before
    // they were kept have only the per-message ones, and say so).
    let weighted = s
        .per_metric
        .as_ref()
        .filter(|_| per_metric)
        .and_then(|m| Some((m.mean_ns?, m.stddev_ns?)));
    let (mean, sd, note) = match weighted {
        Some((mean, sd)) => (Some(mean), Some(sd), "exact, per metric"),
        None => (s.figures.mean_ns, s.figures.stddev_ns, exact_note),
    };
    for (name, v) in [("Mean", mean), ("Std Dev", sd)] {
        rows.push(vec![
            name.to_owned(),
            v.map_or_else(|| "-".into(), duration_f64),
            note.into(),
        ]);
    }
    for p in percentiles {
        rows.push(vec![
            p.label(),
            signed_ns(p.value_ns),
            precision_ns(p.precision_ns),
        ]);
    }
    rows.push(vec![
        "Clock uncertainty".into(),
        s.clock_uncertainty_ns
            .map_or_else(|| "unknown".into(), |u| format!("±{}", duration_ns(u))),
        format!(
            "{}{}",
            s.clock_note,
            if s.clock_warning {
                " — WARNING: not small against P50"
            } else {
                ""
            }
        ),
    ]);
    if let Some(b) = &s.poll_bracket {
        rows.push(poll_bracket_row(b));
    }
    if s.figures.negative > 0 || s.figures.clamped > 0 {
        rows.push(vec![
            "Negative deltas".into(),
            count(s.figures.negative),
            "clock error; flagged, and counted in every figure above".into(),
        ]);
        rows.push(vec![
            "Clamped (> 1 h)".into(),
            count(s.figures.clamped),
            "recorded as 1 h in the percentiles".into(),
        ]);
    }
    rows
}

/// The paragraph above a bounded stage's table: what its polled stamps allow.
pub(super) fn bounds_note(st: &StageSummary, b: &crate::bounds::StageBounds) -> String {
    format!(
        "{} is stamped by polling (a store tap): the event happened no later than that stamp and no earlier than the hop the spec names as its `earliest`. Message by message, this stage lies between {} − {} and {} − {}, so its true figures lie between the same figures of those two (each figure below is monotone in the values), widened by the clock uncertainty (±{}) on each side. A decision (service level, requirement, knee) is met only when the whole interval meets it, failed when none of it does, undecided otherwise.",
        b.polled.join(" and "),
        b.lower_hops.1,
        b.lower_hops.0,
        b.upper_hops.1,
        b.upper_hops.0,
        st.clock_uncertainty_ns
            .map_or_else(|| "unknown".into(), duration_ns)
    )
}

/// What the stage tables count, in a line the report prints.
pub(super) fn counting(s: &Summary) -> String {
    if s.per_metric() {
        format!(
            "Counted per metric: every trace weighted by the metrics its message carried ({} metrics in {} messages), as `hdr_percentile(<stage>_ns, q, metric_count)` computes; Count, Mean, Std Dev and the percentiles are over metrics (Mean and Std Dev exact, from the weighted sums), Min and Max over messages (the same unless a message carried no metric); summary.json holds both (`percentiles` per message, `per_metric`); the charts count messages",
            count(s.totals.metrics),
            count(s.totals.messages)
        )
    } else if s.totals.metrics == s.totals.messages {
        "Counted per message: each message carried one metric, so per message and per metric are the same".into()
    } else {
        "Counted per message: every trace once".into()
    }
}

/// The stage table's row for a polled hop at one end: the largest bracket is the bound
/// (every stamp of the hop is late by at most its own bracket), signed by the end the hop
/// is, with the distribution and the polls beside it.
pub(super) fn poll_bracket_row(b: &PollBracket) -> Vec<String> {
    let (effect, end) = match b.end {
        PolledEnd::To => ("measured long", "ends"),
        PolledEnd::From => ("measured short", "starts"),
    };
    vec![
        "Poll bracket".into(),
        b.end.bound(&duration_ns(b.max_ns)),
        format!(
            "the stage {end} at {}, a store tap's poll: that stamp is late by at most its bracket (the earliest instant the data can have become queryable, a poll's send or the row's store time → the response or notification that reported it), so the stage is {effect} by up to max {}; P50 {}, P99 {}, mean {} over {} keys; poll interval {}, {} polls, {} failed{}",
            b.hop,
            duration_ns(b.max_ns),
            duration_ns(b.p50_ns),
            duration_ns(b.p99_ns),
            duration_ns(b.mean_ns.round() as u64),
            count(b.keys),
            duration_ns(b.poll_interval_ns),
            count(b.polls),
            count(b.poll_errors),
            if b.warning {
                " — WARNING: P99 not small against P50"
            } else {
                ""
            }
        ),
    ]
}

/// `mean 2.3ms, P50 1.6ms, P99 10.7ms, max 151.6ms`, leaving out what a tap did not send.
pub(super) fn cost_spread(c: &CostSpread) -> String {
    if c.count == 0 {
        return "-".into();
    }
    let mut parts = Vec::new();
    if let Some(m) = c.mean_ns {
        parts.push(format!("mean {}", duration_ns(m.round() as u64)));
    }
    for (label, v) in [("P50", c.p50_ns), ("P99", c.p99_ns), ("max", c.max_ns)] {
        if let Some(v) = v {
            parts.push(format!("{label} {}", duration_ns(v)));
        }
    }
    parts.join(", ")
}

/// The section on what the store taps cost: per tap, its polls, its query time as it saw
/// it, and the store's own query duration where the store reports one.
pub(super) fn store_tap_blocks(taps: &[StoreTapCost]) -> Vec<Block> {
    let rows = taps
        .iter()
        .map(|t| {
            vec![
                format!("{} on {} ({})", t.process, t.host, t.hop),
                format!(
                    "{} in {} ({}/s at a {} interval)",
                    count(t.polls),
                    t.polling_s.map_or_else(|| "-".into(), span_s),
                    t.polls_per_s
                        .map_or_else(|| "-".into(), |r| format!("{r:.1}")),
                    duration_ns(t.poll_interval_ns)
                ),
                if t.reconnections > 0 {
                    format!(
                        "{} ({} connections lost and opened again)",
                        count(t.poll_errors),
                        count(t.reconnections)
                    )
                } else {
                    count(t.poll_errors)
                },
                cost_spread(&t.query_time),
                t.server_elapsed.as_ref().map_or_else(
                    || "not reported by the store".into(),
                    |e| format!("{} over {} polls", cost_spread(e), count(e.count)),
                ),
                format!(
                    "{} ({} re-read) for {} keys, found in {} polls{}",
                    count(t.rows),
                    count(t.rows_repeated),
                    count(t.keys_found),
                    count(t.polls_with_keys),
                    t.notified.as_ref().map_or_else(String::new, |n| format!(
                        "; {} keys found first by one of {} notifications (queryable = its arrival, Query Duration 0), {} not `KEY TIME_US`, {} listener connections failed or lost",
                        count(n.keys),
                        count(n.notifications),
                        count(n.bad),
                        count(n.errors)
                    ))
                ),
            ]
        })
        .collect();
    let mut blocks = vec![
        Block::Heading(3, "Store taps: what polling cost".into()),
        Block::Para(
            "Each store tap queried the live store over and over; this is what that cost. Query time is send → response as the tap saw it (network and client included); the store's own duration is what the store reported for the query (ClickHouse's `statistics.elapsed`); rows read include the ones each poll's overlap reads again.".into(),
        ),
        Block::Table(
            [
                "Tap",
                "Polls",
                "Failed",
                "Query time (tap)",
                "Store's own query duration",
                "Rows read",
            ]
            .map(str::to_owned)
            .to_vec(),
            rows,
        ),
    ];
    blocks.extend(taps.iter().filter_map(store_time_disagrees));
    blocks
}

/// What a tap's row times that were off its clock mean for the figures, when there were
/// any: from the first, they stopped bounding the polled hop from below, and a stage to
/// the row time measures that clock's offset as much as latency.
pub(super) fn store_time_disagrees(t: &StoreTapCost) -> Option<Block> {
    let (ahead, ahead_ns) = t.store_time_ahead;
    let (behind, behind_ns) = t.store_time_behind;
    let mut said = Vec::new();
    if ahead > 0 {
        said.push(format!(
            "{} rows carried a time after the response that returned them (up to {})",
            count(ahead),
            duration_ns(ahead_ns)
        ));
    }
    if behind > 0 {
        said.push(format!(
            "{} rows carried a time before their message was published (up to {})",
            count(behind),
            duration_ns(behind_ns)
        ));
    }
    (!said.is_empty()).then(|| {
        Block::Para(format!(
            "**Row times off the tap's clock** ({} on {}): {}. The clock that stamped the rows (the store's, or the writer's when it sends its own times) is not the tap's, or the rows carry a time taken from the message: from the first such row on, the row time no longer bounds `{}` from below (the bound falls back to the polls), and a stage ending at the row time (`store_in`) measures that clock's offset as much as latency.",
            t.process,
            t.host,
            said.join("; "),
            t.hop
        ))
    })
}

pub(super) fn headline(s: &Summary) -> String {
    format!(
        "{} · {} metrics/second · {} total metrics",
        span_s(s.totals.duration_s),
        rate(s.totals.metrics_per_s),
        count(s.totals.metrics)
    )
}

pub(super) fn date_of(unix_ns: i64) -> String {
    let (y, m, d, h, min, sec, _) = hoptrace_format::units::utc_parts(unix_ns);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02}:{sec:02} UTC")
}

/// [`date_of`] to the millisecond.
pub(super) fn date_of_ms(unix_ns: i64) -> String {
    let (y, m, d, h, min, sec, ms) = hoptrace_format::units::utc_parts(unix_ns);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02}:{sec:02}.{ms:03} UTC")
}

/// The "Events" section: what the runs know happened, in time order, marked on the
/// throughput chart and the heatmaps.
fn event_blocks(s: &Summary) -> Vec<Block> {
    let mut b = vec![Block::Heading(2, "Events".into())];
    let kinds = "a probe connection lost before the run's end, a probe connecting again, a collector started again on the run, a host's clock losing or regaining synchronisation or its offset moving by 1 ms or more between two reports, a probe counting records it could not deliver, a publisher or broker tap opening its broker connection again, a publisher sending more than 10 ms behind its schedule";
    if s.events.is_empty() {
        b.push(Block::Para(format!(
            "None of these happened in the runs: {kinds}."
        )));
        return b;
    }
    b.push(Block::Para(format!(
        "What the runs record happening ({kinds}), by the collector's clock (a clock change or a probe's counters: the reporting host's), from the start of the time axis of the charts, where each is a dashed line."
    )));
    let rows = s
        .events
        .iter()
        .map(|e| {
            vec![
                date_of_ms(e.at_unix_ns),
                format!(
                    "{:+.1} s",
                    (e.at_unix_ns - s.throughput.start_unix_ns) as f64 / 1e9
                ),
                e.kind.label().to_owned(),
                e.subject.clone(),
                e.detail.clone(),
            ]
        })
        .collect();
    b.push(Block::Table(
        ["Time", "From start", "Event", "Of", "Detail"]
            .map(String::from)
            .to_vec(),
        rows,
    ));
    b
}

/// The report's blocks.
#[must_use]
pub fn blocks(s: &Summary, charts: &[Chart]) -> Vec<Block> {
    let mut b = Vec::new();
    b.push(Block::Heading(1, format!("{} Test Report", s.pipeline)));
    let interrupted: Vec<&str> = s
        .runs
        .iter()
        .filter(|r| r.interrupted)
        .map(|r| r.run_id.as_str())
        .collect();
    if !interrupted.is_empty() {
        b.push(Block::Para(format!(
            "**Interrupted:** run {} was stopped early (Ctrl-C); the figures cover the load sent until then, less than was planned.",
            interrupted.join(", ")
        )));
    }
    b.push(Block::Heading(2, "Performance Highlights".into()));
    b.push(Block::Para(headline(s)));
    let per_metric = s.per_metric();
    let heads: Vec<&StageSummary> = s.stages.iter().filter(|x| x.headline).collect();
    let pick = |st: &StageSummary, l: &str| {
        st.counted(per_metric)
            .1
            .iter()
            .find(|p| p.is(l))
            .map_or_else(
                || "-".into(),
                |p| {
                    st.with_bounds(
                        format!("{} {}", signed_ns(p.value_ns), precision_ns(p.precision_ns)),
                        l,
                        per_metric,
                    )
                },
            )
    };
    b.push(Block::Table(
        vec!["Stage".into(), "P50".into(), "P99".into(), "P99.99".into()],
        heads
            .iter()
            .map(|st| {
                vec![
                    st.name.clone(),
                    pick(st, "P50"),
                    pick(st, "P99"),
                    pick(st, "P99.99"),
                ]
            })
            .collect(),
    ));
    let first = s.runs.first();
    let start = first.map_or(0, |r| r.started_unix_ns);
    let end = s
        .runs
        .iter()
        .map(|r| r.ended_unix_ns)
        .max()
        .unwrap_or(start);
    b.push(Block::Bullets(vec![
        format!("Date: {}", date_of(start)),
        format!(
            "Run: {} (pipeline {})",
            s.runs
                .iter()
                .map(|r| r.run_id.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            s.pipeline
        ),
        format!(
            "Workload: {} metrics/s achieved in {} messages/s, {} streams, {} publisher(s)",
            rate(s.totals.metrics_per_s),
            rate(s.totals.messages_per_s),
            count(s.totals.streams),
            s.totals.publishers
        ),
        format!(
            "Data window: collector ran {} to {}; messages span {}",
            date_of(start),
            date_of(end),
            span_s(s.totals.duration_s)
        ),
        format!(
            "Percentiles: Computed over the full {} window, {}.",
            span_s(s.totals.duration_s),
            if per_metric {
                "per metric (every trace weighted by its metric count)"
            } else {
                "per message"
            }
        ),
        format!("Clocking: {}", s.environment.clocking),
    ]));

    b.push(Block::Heading(2, "Test Environment".into()));
    let c = &s.environment.collector;
    b.push(Block::Bullets(vec![
        format!("Collector host: {}", c.host),
        format!("CPU: {} logical CPUs, {}", c.cpus, c.cpu_model),
        format!("Memory: {} MiB", count(c.memory_bytes / (1024 * 1024))),
        format!("Kernel: Linux {}", c.kernel),
        format!("Topology: {}", s.environment.topology),
    ]));
    if !s.environment.idle_probes.is_empty() {
        b.push(Block::Para(format!(
            "Probes that stamped nothing the run used (not hosts of any stage; their clocks do not enter any uncertainty): {}",
            s.environment.idle_probes.join("; ")
        )));
    }
    b.push(Block::Table(
        vec![
            "Host".into(),
            "Address".into(),
            "Hops".into(),
            "Processes".into(),
            "Clock".into(),
            "Synced".into(),
            "Max error bound".into(),
            "Max |offset|".into(),
        ],
        s.environment
            .hosts
            .iter()
            .map(|h| {
                vec![
                    h.host.clone(),
                    h.addresses.join(", "),
                    h.hops.join(", "),
                    h.processes.join(", "),
                    if h.clock_sources.is_empty() {
                        "no status".into()
                    } else {
                        h.clock_sources.join("+")
                    },
                    if h.synced && h.clock_samples > 0 {
                        "yes".into()
                    } else {
                        "NO".into()
                    },
                    h.max_error_bound_ns.map_or_else(|| "-".into(), duration_ns),
                    h.max_abs_offset_ns
                        .map_or_else(|| "-".into(), |o| duration_f64(o as f64)),
                ]
            })
            .collect(),
    ));

    b.push(Block::Heading(2, "Latency Stage Definitions".into()));
    b.push(Block::Bullets(
        s.stages
            .iter()
            .map(|st| format!("{}: {}", st.name, st.definition))
            .collect(),
    ));

    b.push(Block::Heading(
        2,
        format!("{} Latency Statistics", s.pipeline),
    ));
    b.push(Block::Bullets(vec![
        format!("Method: {}", s.method.histogram),
        format!(
            "Precision: {} significant figures | Max error: ±{}% of value",
            s.method.significant_digits,
            s.method.max_relative_error * 100.0
        ),
        format!(
            "Files: {} parquet file(s) | Rows: {}",
            s.data.files,
            count(s.data.rows)
        ),
        format!(
            "Duration: {} at {} metrics/second",
            span_s(s.totals.duration_s),
            rate(s.totals.metrics_per_s)
        ),
        counting(s),
        format!("Quantile rank: {}", s.method.rank),
        format!("Deltas: {}", s.method.signs),
        "Std Dev is the population standard deviation (divided by n).".into(),
    ]));
    for st in &s.stages {
        b.push(Block::Heading(
            3,
            format!("{} ({} − {})", st.name, st.to, st.from),
        ));
        let mut head = vec!["Stat".into(), "Value".into(), "Precision".into()];
        let mut rows = stat_rows(st, per_metric);
        if let Some(bounds) = &st.bounds {
            head.push("Bounds (polled stamps and clocks)".into());
            for r in &mut rows {
                let cell = st.bounds_text(&r[0], per_metric).unwrap_or_default();
                r.push(cell);
            }
            b.push(Block::Para(bounds_note(st, bounds)));
        }
        b.push(Block::Table(head, rows));
    }
    if !s.store_taps.is_empty() {
        b.extend(store_tap_blocks(&s.store_taps));
    }
    b.extend(super::tail::tail_blocks(s));

    b.push(Block::Heading(2, "Throughput".into()));
    let per_s: Vec<f64> = s
        .throughput
        .buckets
        .iter()
        .map(|x| x.metrics_per_s)
        .collect();
    let (lo, hi) = per_s
        .iter()
        .fold((f64::INFINITY, 0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    b.push(Block::Para(format!(
        "Metrics per second in {}-second buckets: mean {}, lowest {}, highest {} (first and last buckets may be partial).",
        s.throughput.bucket_s,
        rate(s.totals.metrics_per_s),
        rate(if lo.is_finite() { lo } else { 0.0 }),
        rate(hi)
    )));
    if let Some(i) = charts.iter().position(|c| c.stem == "throughput") {
        b.push(Block::Chart(i));
    }
    b.extend(event_blocks(s));

    b.push(Block::Heading(2, "Accounting".into()));
    let a = &s.accounting;
    let mut rows = vec![
        vec!["Sent (publishers' own count)".into(), count(a.sent)],
        vec!["Complete (every expected hop)".into(), count(a.complete)],
        vec!["Incomplete".into(), count(a.incomplete)],
    ];
    for (hop, n) in &a.missing_by_hop {
        rows.push(vec![format!("  missing {hop}"), count(*n)]);
    }
    rows.extend([
        vec![
            "Unseen (sent, no stamp reached the collector: dropped)".into(),
            count(a.unseen),
        ],
        vec![
            "Records lost by probes (queue full, send failed, evicted before the collector acknowledged them)".into(),
            count(a.records_lost_by_probes),
        ],
        vec!["Duplicates (flagged)".into(), count(a.duplicates)],
        vec!["Negative deltas (flagged)".into(), count(a.negative_deltas)],
        vec![
            "Late records (after their trace was written; never a second row)".into(),
            count(a.late_records),
        ],
        vec![
            "Records of undeclared hops".into(),
            count(a.unknown_hop_records),
        ],
        vec![
            "Records of hops their connection did not announce".into(),
            count(a.unannounced_hop_records),
        ],
        vec![
            "Records with an implausible stamp (dropped)".into(),
            count(a.implausible_records),
        ],
        vec![
            "Records probes sent again after a collector restart".into(),
            count(a.records_resent_by_probes),
        ],
        vec![
            "  of which the run already held (dropped)".into(),
            count(a.resent_records_dropped),
        ],
        vec![
            "Traces with an implausible intended time (flagged)".into(),
            count(a.implausible_traces),
        ],
        vec![
            "Traces whose keys were never reported sent".into(),
            count(a.not_sent),
        ],
        vec![
            "Counts add up".into(),
            if a.adds_up { "yes" } else { "NO" }.into(),
        ],
    ]);
    b.push(Block::Table(vec!["".into(), "Messages".into()], rows));
    let restarts: Vec<Vec<String>> = s
        .runs
        .iter()
        .flat_map(|r| r.restarts.iter().map(move |x| (r, x)))
        .map(|(r, x)| {
            vec![
                r.run_id.clone(),
                date_of(x.at_unix_ns),
                x.checkpoint_unix_ns
                    .map_or_else(|| "the run's start".to_owned(), date_of),
                count(x.log_entries),
                count(x.records_replayed),
                if x.replay_ms < 1000 {
                    format!("{} ms", x.replay_ms)
                } else {
                    format!("{:.1} s", x.replay_ms as f64 / 1e3)
                },
                hoptrace_format::units::bytes(x.torn_bytes),
                count(x.resent_records_dropped),
            ]
        })
        .collect();
    if !restarts.is_empty() {
        b.push(Block::Para(format!(
            "**Collector restarts:** the collector was stopped without closing the run {} time(s) and started again; each time it took up the run's last checkpoint (when there was one yet), replayed the run's log after it and continued. Records acknowledged to probes were in the log or the checkpoint; probes sent again what was not, and what the run already held was dropped once more, so no message is counted twice.",
            restarts.len()
        )));
        b.push(Block::Table(
            vec![
                "Run".into(),
                "Restarted".into(),
                "Log replayed from".into(),
                "Log entries replayed".into(),
                "Hop records held".into(),
                "Replay took".into(),
                "Half-written tail skipped".into(),
                "Re-sent records dropped".into(),
            ],
            restarts,
        ));
    }
    if !a.discrepancies.is_empty() {
        b.push(Block::Para("The counts do not add up:".into()));
        b.push(Block::Bullets(a.discrepancies.clone()));
    }

    b.push(Block::Heading(2, "Charts".into()));
    let groups = [
        ("1) Latency Histograms", "latency-histograms"),
        (
            "2) Latency Cumulative Distribution Functions",
            "latency-cdf",
        ),
        ("3) Latency Heatmaps", "heatmap-"),
    ];
    for (title, prefix) in groups {
        b.push(Block::Heading(3, title.into()));
        for (i, c) in charts.iter().enumerate() {
            if c.stem.starts_with(prefix) {
                b.push(Block::Chart(i));
            }
        }
    }
    if !s.warnings.is_empty() {
        b.push(Block::Heading(2, "Warnings".into()));
        b.push(Block::Bullets(s.warnings.clone()));
    }
    b
}
