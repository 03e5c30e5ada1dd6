//! The report of a run, in the shape of the reference report: highlights, test
//! environment, stage definitions, per-stage statistics with precision and clock
//! uncertainty, throughput, accounting and charts.
//!
//! [`write()`] produces, in one directory: `report.md` (tables and SVG chart images),
//! `report.html` (self-contained and offline: vega, vega-lite and vega-embed inlined),
//! `summary.json` and `charts/*.vl.json` (+ `charts/*.svg`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::charts::{self, Chart};
use crate::summary::{
    CostSpread, PollBracket, PolledEnd, StageHistograms, StageSummary, StoreTapCost, Summary,
};
use crate::{AnalysisError, write_file};
use hoptrace_format::units::{
    count, duration_f64, duration_ns, precision_ns, rate, signed_ns, span_s,
};

/// One block of a report, rendered to Markdown and to HTML alike.
#[derive(Debug, Clone)]
pub enum Block {
    /// A heading of level 1 to 3.
    Heading(u8, String),
    /// A paragraph.
    Para(String),
    /// A bullet list.
    Bullets(Vec<String>),
    /// A table: header and rows.
    Table(Vec<String>, Vec<Vec<String>>),
    /// A chart, by index into the chart list.
    Chart(usize),
}

/// Where the chart libraries are: `$HOPTRACE_WEB_DIR`; else `analysis/web` of the
/// nearest enclosing hoptrace checkout of the working directory that has them
/// installed; else `analysis/web` of the source tree this binary was built from.
#[must_use]
pub fn web_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HOPTRACE_WEB_DIR") {
        return PathBuf::from(dir);
    }
    let built = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/web"));
    std::env::current_dir()
        .ok()
        .and_then(|cwd| {
            cwd.ancestors()
                .map(|dir| dir.join("analysis/web"))
                .find(|web| web.join(LIBS[0]).is_file())
        })
        .unwrap_or(built)
}

const LIBS: [&str; 3] = [
    "node_modules/vega/build/vega.min.js",
    "node_modules/vega-lite/build/vega-lite.min.js",
    "node_modules/vega-embed/build/vega-embed.min.js",
];

/// What [`write()`] produced.
#[derive(Debug, Clone)]
pub struct Written {
    /// `report.md`.
    pub markdown: PathBuf,
    /// `report.html`.
    pub html: PathBuf,
    /// `summary.json`.
    pub summary: PathBuf,
    /// Chart specs.
    pub charts: Vec<PathBuf>,
    /// Whether the SVG images of `report.md` were rendered.
    pub images: bool,
}

fn stat_rows(s: &StageSummary, per_metric: bool) -> Vec<Vec<String>> {
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
                format!("metrics ({} messages)", count(s.count))
            } else {
                "—".into()
            },
        ],
        [
            vec!["Min".to_owned()],
            exact(s.min_ns.map(|v| duration_f64(v as f64))),
        ]
        .concat(),
        [
            vec!["Max".to_owned()],
            exact(s.max_ns.map(|v| duration_f64(v as f64))),
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
        None => (s.mean_ns, s.stddev_ns, exact_note),
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
            p.label.clone(),
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
    if s.negative > 0 || s.clamped > 0 {
        rows.push(vec![
            "Negative deltas".into(),
            count(s.negative),
            "clock error; flagged, and counted in every figure above".into(),
        ]);
        rows.push(vec![
            "Clamped (> 1 h)".into(),
            count(s.clamped),
            "recorded as 1 h in the percentiles".into(),
        ]);
    }
    rows
}

/// `[lower, upper]` of the statistic a stage table's row shows (`Min`, `P99`, ...), from
/// the stage's bounds widened by its clock uncertainty; `None` for rows without one.
fn bounds_cell(st: &StageSummary, label: &str, per_metric: bool) -> Option<String> {
    st.bounds.as_ref()?;
    let name = match label {
        "Min" => "min".to_owned(),
        "Max" => "max".to_owned(),
        "Mean" => "mean".to_owned(),
        l if l.starts_with('P') => l.to_ascii_lowercase(),
        _ => return None,
    };
    let (lo, hi) = st.stat_interval(&name, per_metric)?;
    Some(format!(
        "[{}, {}]{}",
        duration_f64(lo),
        duration_f64(hi),
        if st.clock_uncertainty_ns.is_none() {
            " + clock unknown"
        } else {
            ""
        }
    ))
}

/// The paragraph above a bounded stage's table: what its polled stamps allow.
fn bounds_note(st: &StageSummary, b: &crate::bounds::StageBounds) -> String {
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
fn counting(s: &Summary) -> String {
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
fn poll_bracket_row(b: &PollBracket) -> Vec<String> {
    let (effect, end) = match b.end {
        PolledEnd::To => ("measured long", "ends"),
        PolledEnd::From => ("measured short", "starts"),
    };
    vec![
        "Poll bracket".into(),
        b.end.bound(&duration_ns(b.max_ns)),
        format!(
            "the stage {end} at {}, a store tap's poll: that stamp is late by at most its bracket (previous poll's send → this response), so the stage is {effect} by up to max {}; P50 {}, P99 {}, mean {} over {} keys; poll interval {}, {} polls, {} failed{}",
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
fn cost_spread(c: &CostSpread) -> String {
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
fn store_tap_blocks(taps: &[StoreTapCost]) -> Vec<Block> {
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
                    "{} ({} re-read) for {} keys, found in {} polls",
                    count(t.rows),
                    count(t.rows_repeated),
                    count(t.keys_found),
                    count(t.polls_with_keys)
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
fn store_time_disagrees(t: &StoreTapCost) -> Option<Block> {
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

fn headline(s: &Summary) -> String {
    format!(
        "{} · {} metrics/second · {} total metrics",
        span_s(s.totals.duration_s),
        rate(s.totals.metrics_per_s),
        count(s.totals.metrics)
    )
}

fn date_of(unix_ns: i64) -> String {
    let (y, m, d, h, min, sec, _) = hoptrace_format::units::utc_parts(unix_ns);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02}:{sec:02} UTC")
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
            .find(|p| p.label == l)
            .map_or_else(
                || "-".into(),
                |p| {
                    format!(
                        "{} {}{}",
                        signed_ns(p.value_ns),
                        precision_ns(p.precision_ns),
                        bounds_cell(st, l, per_metric)
                            .map(|b| format!(" {b}"))
                            .unwrap_or_default()
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
                let cell = bounds_cell(st, &r[0], per_metric).unwrap_or_default();
                r.push(cell);
            }
            b.push(Block::Para(bounds_note(st, bounds)));
        }
        b.push(Block::Table(head, rows));
    }
    if !s.store_taps.is_empty() {
        b.extend(store_tap_blocks(&s.store_taps));
    }

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

/// The anchor of a heading, as GitHub makes it: lower case, letters, digits, `-` and `_`
/// kept, spaces turned into `-`, everything else dropped.
#[must_use]
pub fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// The anchor of every heading of `blocks` (`None` for other blocks), unique within the
/// page: a repeated one gets `-1`, `-2` ... as GitHub numbers them.
#[must_use]
pub fn anchors(blocks: &[Block]) -> Vec<Option<String>> {
    let mut seen = std::collections::HashMap::<String, usize>::new();
    blocks
        .iter()
        .map(|b| match b {
            Block::Heading(_, t) => {
                let base = slug(t);
                let n = seen.entry(base.clone()).or_default();
                let id = if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                };
                *n += 1;
                Some(id)
            }
            _ => None,
        })
        .collect()
}

/// The table of contents: the headings of levels 2 and 3 after the first heading, as
/// (level, text, anchor); empty when there are fewer than two of level 2.
fn contents(blocks: &[Block]) -> Vec<(u8, String, String)> {
    let entries: Vec<(u8, String, String)> = blocks
        .iter()
        .zip(anchors(blocks))
        .skip(1)
        .filter_map(|(b, a)| match (b, a) {
            (Block::Heading(l @ 2..=3, t), Some(a)) => Some((*l, t.clone(), a)),
            _ => None,
        })
        .collect();
    if entries.iter().filter(|e| e.0 == 2).count() < 2 {
        return Vec::new();
    }
    entries
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// Renders blocks as Markdown; charts as images `charts/<stem>.svg`.
#[must_use]
pub fn markdown(blocks: &[Block], charts: &[Chart]) -> String {
    let mut out = String::new();
    let toc = contents(blocks);
    for (i, b) in blocks.iter().enumerate() {
        match b {
            Block::Heading(l, t) => {
                let _ = writeln!(out, "{} {t}\n", "#".repeat(usize::from(*l)));
                if i == 0 && !toc.is_empty() {
                    out.push_str("**Contents**\n\n");
                    for (level, text, anchor) in &toc {
                        let indent = if *level == 3 { "  " } else { "" };
                        let _ = writeln!(
                            out,
                            "{indent}- [{}](#{anchor})",
                            text.replace('[', "\\[").replace(']', "\\]")
                        );
                    }
                    out.push('\n');
                }
            }
            Block::Para(t) => {
                let _ = writeln!(out, "{t}\n");
            }
            Block::Bullets(items) => {
                for i in items {
                    let _ = writeln!(out, "- {i}");
                }
                out.push('\n');
            }
            Block::Table(head, rows) => {
                let line = |cells: &[String]| {
                    format!(
                        "| {} |",
                        cells
                            .iter()
                            .map(|c| md_cell(c))
                            .collect::<Vec<_>>()
                            .join(" | ")
                    )
                };
                let _ = writeln!(out, "{}", line(head));
                let _ = writeln!(out, "|{}", " --- |".repeat(head.len()));
                for r in rows {
                    let _ = writeln!(out, "{}", line(r));
                }
                out.push('\n');
            }
            Block::Chart(i) => {
                let c = &charts[*i];
                let _ = writeln!(out, "![{}](charts/{}.svg)\n", c.title, c.stem);
            }
        }
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders blocks as one self-contained HTML page; `libs` are the chart libraries'
/// sources, inlined in order.
#[must_use]
pub fn html(blocks: &[Block], charts: &[Chart], title: &str, libs: &[String]) -> String {
    let mut body = String::new();
    let toc = contents(blocks);
    for (i, (b, anchor)) in blocks.iter().zip(anchors(blocks)).enumerate() {
        match b {
            Block::Heading(l, t) => {
                let id = anchor.unwrap_or_default();
                let _ = writeln!(
                    body,
                    "<h{l} id=\"{}\"><a class=\"anchor\" href=\"#{}\">{}</a></h{l}>",
                    esc(&id),
                    esc(&id),
                    esc(t)
                );
                if i == 0 && !toc.is_empty() {
                    body.push_str("<nav id=\"toc\" aria-label=\"Contents\">\n<div class=\"toc-title\">Contents</div>\n<ul>\n");
                    let mut in_sub = false;
                    for (n, (level, text, anchor)) in toc.iter().enumerate() {
                        let link = format!("<a href=\"#{}\">{}</a>", esc(anchor), esc(text));
                        if *level == 2 {
                            if in_sub {
                                body.push_str("</ul>");
                                in_sub = false;
                            }
                            if n > 0 {
                                body.push_str("</li>\n");
                            }
                            let _ = write!(body, "<li>{link}");
                        } else {
                            if !in_sub {
                                body.push_str("\n<ul>\n");
                                in_sub = true;
                            }
                            let _ = writeln!(body, "<li>{link}</li>");
                        }
                    }
                    body.push_str(if in_sub { "</ul></li>\n" } else { "</li>\n" });
                    body.push_str("</ul>\n</nav>\n");
                }
            }
            Block::Para(t) => {
                let _ = writeln!(body, "<p>{}</p>", esc(t));
            }
            Block::Bullets(items) => {
                body.push_str("<ul>\n");
                for i in items {
                    let _ = writeln!(body, "<li>{}</li>", esc(i));
                }
                body.push_str("</ul>\n");
            }
            Block::Table(head, rows) => {
                body.push_str("<table>\n<thead><tr>");
                for h in head {
                    let _ = write!(body, "<th>{}</th>", esc(h));
                }
                body.push_str("</tr></thead>\n<tbody>\n");
                for r in rows {
                    body.push_str("<tr>");
                    for c in r {
                        let _ = write!(body, "<td>{}</td>", esc(c));
                    }
                    body.push_str("</tr>\n");
                }
                body.push_str("</tbody>\n</table>\n");
            }
            Block::Chart(i) => {
                let _ = writeln!(
                    body,
                    "<div class=\"chart\" id=\"chart-{i}\" data-stem=\"{}\"></div>",
                    esc(&charts[*i].stem)
                );
            }
        }
    }
    let specs: Vec<serde_json::Value> = charts.iter().map(|c| c.spec.clone()).collect();
    // `</` cannot appear inside a script element.
    let specs_json = serde_json::to_string(&specs)
        .unwrap_or_default()
        .replace("</", "<\\/");
    let mut scripts = String::new();
    for lib in libs {
        let _ = writeln!(
            scripts,
            "<script>{}</script>",
            lib.replace("</script", "<\\/script")
        );
    }
    format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; max-width: 980px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }}
th {{ background: #f3f3f3; }}
td:nth-child(2) {{ font-variant-numeric: tabular-nums; }}
.chart {{ margin: 1em 0 2em; }}
.chart-error {{ color: #b00; }}
h1 a.anchor, h2 a.anchor, h3 a.anchor {{ color: inherit; text-decoration: none; }}
#toc {{ border: 1px solid #ddd; background: #fafafa; padding: 0.5em 1.2em; margin: 1em 0 2em; }}
#toc .toc-title {{ font-weight: bold; margin: 0.3em 0; }}
#toc ul {{ margin: 0.2em 0; padding-left: 1.2em; }}
</style>
{scripts}</head>
<body>
{body}<script>
const specs = {specs_json};
const pending = [];
document.querySelectorAll('.chart').forEach((el) => {{
  const i = Number(el.id.slice('chart-'.length));
  pending.push(vegaEmbed(el, specs[i], {{ actions: false, renderer: 'svg' }})
    .then(() => el.setAttribute('data-rendered', 'true'))
    .catch((e) => {{ el.className += ' chart-error'; el.textContent = 'chart failed: ' + e; console.error(e); }}));
}});
Promise.all(pending).then(() => document.body.setAttribute('data-charts', 'done'));
</script>
</body>
</html>
"#,
        title = esc(title),
    )
}

/// Reads the chart libraries to inline into `report.html`.
///
/// # Errors
/// [`AnalysisError::Render`] naming the missing file and how to install it.
pub fn read_libs() -> Result<Vec<String>, AnalysisError> {
    let dir = web_dir();
    LIBS.iter()
        .map(|rel| {
            let p = dir.join(rel);
            std::fs::read_to_string(&p).map_err(|e| {
                AnalysisError::Render(format!(
                    "{}: {e}; install the chart libraries with `npm ci --prefix {}` (infra/setup.sh does) or set HOPTRACE_WEB_DIR",
                    p.display(),
                    dir.display()
                ))
            })
        })
        .collect()
}

/// Renders chart specs to SVG with Node.js (`analysis/web/render.mjs`).
///
/// # Errors
/// When node is missing or a chart fails to render.
pub fn render_svgs(specs: &[(PathBuf, PathBuf)]) -> Result<(), AnalysisError> {
    let script = web_dir().join("render.mjs");
    let mut cmd = Command::new("node");
    cmd.arg(&script);
    for (spec, svg) in specs {
        cmd.arg(spec).arg(svg);
    }
    let out = cmd
        .output()
        .map_err(|e| AnalysisError::Render(format!("running node {}: {e}", script.display())))?;
    if !out.status.success() {
        return Err(AnalysisError::Render(format!(
            "rendering chart images failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// A section a caller appends to a report (the soak's resources, for one): its blocks,
/// whose [`Block::Chart`] indices count from 0 within the section's own charts.
#[derive(Debug, Clone, Default)]
pub struct Section {
    /// The section's blocks.
    pub blocks: Vec<Block>,
    /// The section's charts.
    pub charts: Vec<Chart>,
}

/// Writes the whole report of `summary` into `dir`.
///
/// # Errors
/// When a file cannot be written or the chart libraries are missing. SVG images that
/// fail to render (no Node.js) are not an error: `report.md` then says so.
pub fn write(
    dir: &Path,
    summary: &Summary,
    hists: &[StageHistograms],
) -> Result<Written, AnalysisError> {
    write_with(dir, summary, hists, &[])
}

/// [`write()`], with `sections` appended after the report's own.
///
/// # Errors
/// As [`write()`].
pub fn write_with(
    dir: &Path,
    summary: &Summary,
    hists: &[StageHistograms],
    sections: &[Section],
) -> Result<Written, AnalysisError> {
    let mut charts = charts::all(summary, hists);
    let mut extra = Vec::new();
    for sec in sections {
        let offset = charts.len();
        extra.extend(sec.blocks.iter().map(|b| match b {
            Block::Chart(i) => Block::Chart(offset + i),
            other => other.clone(),
        }));
        charts.extend(sec.charts.iter().cloned());
    }
    let mut blocks = blocks(summary, &charts);
    blocks.extend(extra);
    let title = format!("{} Test Report", summary.pipeline);
    let page = write_page(dir, "report", &title, &blocks, &charts)?;
    let written = Written {
        markdown: page.markdown,
        html: page.html,
        summary: dir.join("summary.json"),
        charts: page.charts,
        images: page.images,
    };
    write_file(
        &written.summary,
        serde_json::to_vec_pretty(summary).unwrap_or_default(),
    )?;
    Ok(written)
}

/// What [`write_page`] produced.
#[derive(Debug, Clone)]
pub struct Page {
    /// `<stem>.md`.
    pub markdown: PathBuf,
    /// `<stem>.html`, self-contained.
    pub html: PathBuf,
    /// Chart specs, `charts/<chart>.vl.json`.
    pub charts: Vec<PathBuf>,
    /// Whether the SVG images the Markdown shows were rendered.
    pub images: bool,
}

/// Writes `blocks` as `<stem>.md` (with SVG images of the charts) and a self-contained
/// `<stem>.html` into `dir`, the chart specs and images under `dir/charts/`.
///
/// # Errors
/// When a file cannot be written or the chart libraries are missing. SVG images that
/// fail to render (no Node.js) are not an error: the Markdown then says so.
pub fn write_page(
    dir: &Path,
    stem: &str,
    title: &str,
    blocks: &[Block],
    charts: &[Chart],
) -> Result<Page, AnalysisError> {
    let libs = read_libs()?;
    let chart_dir = dir.join("charts");
    let mut spec_paths = Vec::new();
    let mut pairs = Vec::new();
    for c in charts {
        let spec = chart_dir.join(format!("{}.vl.json", c.stem));
        write_file(
            &spec,
            serde_json::to_vec_pretty(&c.spec).unwrap_or_default(),
        )?;
        pairs.push((spec.clone(), chart_dir.join(format!("{}.svg", c.stem))));
        spec_paths.push(spec);
    }
    let images = match render_svgs(&pairs) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!("chart images not rendered: {e}");
            false
        }
    };
    let mut md = markdown(blocks, charts);
    if !images {
        md.push_str(&format!("\n_Chart images were not rendered (Node.js missing); the charts are in {stem}.html and charts/*.vl.json._\n"));
    }
    let page = Page {
        markdown: dir.join(format!("{stem}.md")),
        html: dir.join(format!("{stem}.html")),
        charts: spec_paths,
        images,
    };
    write_file(&page.markdown, md)?;
    write_file(&page.html, html(blocks, charts, title, &libs))?;
    Ok(page)
}

#[cfg(test)]
mod tests;
