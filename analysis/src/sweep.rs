//! Sweeps: a matrix of settings, one run per cell, each judged over a fixed measured
//! window after a warm-up; the knee of every series of cells (the highest rate that
//! meets the service levels), capacity planning from it, and the sweep report.
//!
//! A cell's figures are written as [`CELL_FILE`] into its run directory, so a session
//! over the sweep's runs has them as the `cells` table (see [`crate::session`]) and every
//! cell can be queried together with its traces.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::AnalysisError;
use crate::charts::{self, Chart};
use crate::report::{self, Block, Page};
use crate::summary::{StageSummary, WindowSummary};
use hoptrace_format::units;

/// A cell's figures, in its run directory.
pub const CELL_FILE: &str = "cell.json";
/// The setting that names the offered rate; a series is every other setting held fixed.
pub const RATE: &str = "rate";
/// Achieved / target rate a cell must reach to count as keeping up.
pub const KEEP_UP_RATIO: f64 = 0.99;

/// One setting of a cell: `acks` = `all`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Setting {
    /// Dimension name: `rate`, `qos`, `acks`, `partitions`, ...
    pub name: String,
    /// Its value as given.
    pub value: String,
}

/// A service level objective and whether a cell met it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SloResult {
    /// As written: `Total Ingestion.p99 < 5ms`.
    pub slo: String,
    /// Whether the window's figures meet it for every value their bounds allow.
    pub met: bool,
    /// Met, failed, or undecided (the bounds of a polled stage or the clocks' uncertainty
    /// hold it for some values and not for others). Absent in sweeps written before it:
    /// met or failed as `met` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<crate::bounds::Decision>,
}

impl SloResult {
    /// The decision, as written or from `met`.
    #[must_use]
    pub fn decision(&self) -> crate::bounds::Decision {
        use crate::bounds::Decision;
        self.decision.unwrap_or(if self.met {
            Decision::Met
        } else {
            Decision::Failed
        })
    }
}

/// One CPU and memory figure of a process during a cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CellProcess {
    /// Role: publisher, processor, store, collector, broker (...).
    pub process: String,
    /// Mean CPU after warm-up, cores.
    pub cpu_mean: f64,
    /// Largest RSS, bytes.
    pub rss_max_bytes: u64,
}

/// A finished cell of a sweep.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cell {
    /// The sweep's name.
    pub sweep: String,
    /// The cell's run id (also its directory names).
    pub run_id: String,
    /// Position in the matrix, from 0.
    pub index: usize,
    /// Its settings, in the matrix's order of dimensions.
    pub settings: Vec<Setting>,
    /// Offered load, metrics per second.
    pub target_metrics_per_s: u64,
    /// Metrics per message.
    pub metrics_per_message: u32,
    /// Broker address as used (with its options).
    pub broker: String,
    /// Broker program and version.
    pub broker_version: String,
    /// Left out before the window, seconds.
    pub warmup_s: f64,
    /// The measured window.
    pub window: WindowSummary,
    /// Messages the publisher sent over the whole cell (warm-up and drain included).
    pub sent: u64,
    /// Whether the whole cell's counts add up (sent = complete + incomplete + unseen).
    pub adds_up: bool,
    /// Whether everything sent reached the collector before the pipeline stopped.
    pub drained: bool,
    /// The publisher's schedule lag, P99, ns.
    pub schedule_lag_p99_ns: u64,
    /// Every service level, judged on the window.
    pub slos: Vec<SloResult>,
    /// CPU and memory of every process after warm-up.
    pub resources: Vec<CellProcess>,
}

impl Cell {
    /// A setting's value.
    #[must_use]
    pub fn setting(&self, name: &str) -> Option<&str> {
        self.settings
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.value.as_str())
    }

    /// Metrics per second due in the window that were sent.
    #[must_use]
    pub fn achieved_metrics_per_s(&self) -> f64 {
        self.window.metrics as f64 / self.window.length_s().max(1e-9)
    }

    /// Messages due in the window that did not complete.
    #[must_use]
    pub fn lost(&self) -> u64 {
        self.window.messages - self.window.complete.min(self.window.messages)
    }

    /// Achieved rate within [`KEEP_UP_RATIO`] of the target.
    #[must_use]
    pub fn kept_up(&self) -> bool {
        self.achieved_metrics_per_s() >= KEEP_UP_RATIO * self.target_metrics_per_s as f64
    }

    /// The cell holds: it kept up, every message of the window completed, and every
    /// service level was met.
    #[must_use]
    pub fn holds(&self) -> bool {
        self.kept_up()
            && self.window.messages > 0
            && self.lost() == 0
            && self.slos.iter().all(|s| s.met)
    }

    /// The settings other than the rate: the cell's series.
    #[must_use]
    pub fn series(&self) -> Vec<Setting> {
        self.settings
            .iter()
            .filter(|s| s.name != RATE)
            .cloned()
            .collect()
    }

    /// Reads a cell file.
    ///
    /// # Errors
    /// When it cannot be read or parsed.
    pub fn read(path: &Path) -> Result<Self, AnalysisError> {
        let bytes = std::fs::read(path).map_err(|e| AnalysisError::Cell {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        serde_json::from_slice(&bytes).map_err(|e| AnalysisError::Cell {
            path: path.to_owned(),
            reason: e.to_string(),
        })
    }
}

/// The knee of one series: the highest offered rate at which it held, every lower rate
/// holding too.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Knee {
    /// The series' settings (all but the rate).
    pub series: Vec<Setting>,
    /// The cell at the knee, if any rate held.
    pub run_id: Option<String>,
    /// Offered rate at the knee, metrics/s.
    pub target_metrics_per_s: Option<u64>,
    /// Achieved rate at the knee, metrics/s.
    pub achieved_metrics_per_s: Option<f64>,
    /// The lowest rate that did not hold, metrics/s: the knee lies below it.
    pub first_failing_metrics_per_s: Option<u64>,
    /// Why that rate did not hold.
    pub failing_because: Option<String>,
    /// Rates below the first failing one whose service levels the bounds could not decide
    /// (a P99 inside its poll bounds). Empty when every cell was decided.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub undecided_metrics_per_s: Vec<u64>,
    /// With undecided rates: the highest rate below the first failing one that held or
    /// was undecided. The knee lies from `target_metrics_per_s` (proven) to this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper_metrics_per_s: Option<u64>,
}

impl Knee {
    /// The first rate that did not hold, as said: when none failed, whether every rate
    /// held or some were undecided (then the knee may lie above the sweep or not).
    #[must_use]
    pub fn first_failing_shown(&self) -> String {
        match self.first_failing_metrics_per_s {
            Some(v) => units::rate(v as f64),
            None if self.undecided_metrics_per_s.is_empty() => {
                "all held (the knee is above the sweep)".into()
            }
            None => format!(
                "none failed; undecided at {} (the knee may lie above the sweep)",
                self.undecided_metrics_per_s
                    .iter()
                    .map(|v| units::rate(*v as f64))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// The knee as said: `50.0k` when proven, `50.0k to 200.0k (undecided inside its
    /// bounds)` when undecided cells leave a range, `none held` when no rate held.
    #[must_use]
    pub fn shown(&self) -> String {
        match (self.target_metrics_per_s, self.upper_metrics_per_s) {
            (lo, Some(hi)) => format!(
                "{} to {} (undecided within the bounds)",
                lo.map_or_else(|| "none".into(), |v| units::rate(v as f64)),
                units::rate(hi as f64)
            ),
            (Some(lo), None) => units::rate(lo as f64),
            (None, None) => "none held".into(),
        }
    }
}

/// What a cell's window says of its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It kept up, lost nothing and met every service level.
    Holds,
    /// It kept up and lost nothing, and a service level lies inside its bounds.
    Undecided(String),
    /// Something failed: why.
    Fails(String),
}

/// The verdict on a cell.
#[must_use]
pub fn verdict(c: &Cell) -> Verdict {
    use crate::bounds::Decision;
    let undecided: Vec<String> = c
        .slos
        .iter()
        .filter(|s| s.decision() == Decision::Undecided)
        .map(|s| format!("undecided {} (inside its bounds)", s.slo))
        .collect();
    match why_not(c) {
        Some(why) if why_fails(c) => Verdict::Fails(why),
        _ if !undecided.is_empty() => Verdict::Undecided(undecided.join("; ")),
        Some(why) => Verdict::Fails(why),
        None => Verdict::Holds,
    }
}

/// Whether something other than an undecided service level failed.
fn why_fails(c: &Cell) -> bool {
    use crate::bounds::Decision;
    c.window.messages == 0
        || !c.kept_up()
        || c.lost() > 0
        || c.slos.iter().any(|s| s.decision() == Decision::Failed)
}

/// Why a cell does not hold, in words; `None` when it holds.
#[must_use]
pub fn why_not(c: &Cell) -> Option<String> {
    let mut why = Vec::new();
    if c.window.messages == 0 {
        why.push("no messages in the window".to_owned());
    }
    if !c.kept_up() {
        why.push(format!(
            "achieved {} of {} metrics/s",
            units::rate(c.achieved_metrics_per_s()),
            units::rate(c.target_metrics_per_s as f64)
        ));
    }
    if c.lost() > 0 {
        why.push(format!("{} messages incomplete", units::count(c.lost())));
    }
    why.extend(c.slos.iter().filter(|s| !s.met).map(|s| {
        if s.decision() == crate::bounds::Decision::Undecided {
            format!("undecided {} (inside its bounds)", s.slo)
        } else {
            format!("missed {}", s.slo)
        }
    }));
    (!why.is_empty()).then(|| why.join("; "))
}

/// The knee of every series of `cells`, series in the order they first appear.
#[must_use]
pub fn knees(cells: &[Cell]) -> Vec<Knee> {
    let mut series: Vec<Vec<Setting>> = Vec::new();
    for c in cells {
        let s = c.series();
        if !series.contains(&s) {
            series.push(s);
        }
    }
    series
        .into_iter()
        .map(|s| {
            let mut of: Vec<&Cell> = cells.iter().filter(|c| c.series() == s).collect();
            of.sort_by_key(|c| c.target_metrics_per_s);
            let mut knee = Knee {
                series: s,
                run_id: None,
                target_metrics_per_s: None,
                achieved_metrics_per_s: None,
                first_failing_metrics_per_s: None,
                failing_because: None,
                undecided_metrics_per_s: Vec::new(),
                upper_metrics_per_s: None,
            };
            // The knee: the highest rate that held with every rate below it. Past an
            // undecided rate, the knee may be anywhere up to the first rate that failed.
            let mut proven = true;
            for c in of {
                match verdict(c) {
                    Verdict::Fails(why) => {
                        knee.first_failing_metrics_per_s = Some(c.target_metrics_per_s);
                        knee.failing_because = Some(why);
                        break;
                    }
                    Verdict::Undecided(_) => {
                        proven = false;
                        knee.undecided_metrics_per_s.push(c.target_metrics_per_s);
                        knee.upper_metrics_per_s = Some(c.target_metrics_per_s);
                    }
                    Verdict::Holds if proven => {
                        knee.run_id = Some(c.run_id.clone());
                        knee.target_metrics_per_s = Some(c.target_metrics_per_s);
                        knee.achieved_metrics_per_s = Some(c.achieved_metrics_per_s());
                    }
                    Verdict::Holds => knee.upper_metrics_per_s = Some(c.target_metrics_per_s),
                }
            }
            knee
        })
        .collect()
}

/// Hosts needed to carry `target` metrics/s when one host carries `per_host` within the
/// service levels: `ceil(target / per_host)`.
#[must_use]
pub fn hosts_needed(target: f64, per_host: f64) -> Option<u64> {
    (per_host > 0.0).then(|| (target / per_host).ceil() as u64)
}

/// What a sweep report is about.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepInfo {
    /// The sweep's name.
    pub name: String,
    /// The command as given.
    pub command: String,
    /// Broker address (base, before per-cell options).
    pub broker: String,
    /// Dimensions and their values, in order.
    pub dimensions: Vec<(String, Vec<String>)>,
    /// Warm-up per cell, seconds.
    pub warmup_s: f64,
    /// Measured window per cell, seconds.
    pub window_s: f64,
    /// The service levels.
    pub slos: Vec<String>,
    /// The load capacity planning sizes for, metrics/s.
    pub capacity_target_metrics_per_s: Option<u64>,
    /// The machine: CPU model and cores, memory, kernel.
    pub machine: String,
    /// How the Kafka topics the sweep created are replicated (`None`: it created none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topics: Option<String>,
}

/// What `sweep.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepReport {
    /// The sweep.
    pub info: SweepInfo,
    /// Every finished cell, in matrix order.
    pub cells: Vec<Cell>,
    /// Every series' knee.
    pub knees: Vec<Knee>,
}

/// `qos=1, connections=4`; `all cells` for none.
#[must_use]
pub fn settings_label(s: &[Setting]) -> String {
    if s.is_empty() {
        return "all cells".into();
    }
    s.iter()
        .map(|x| format!("{}={}", x.name, x.value))
        .collect::<Vec<_>>()
        .join(", ")
}

fn with_precision(st: &StageSummary, label: &str) -> String {
    st.percentile(label).map_or_else(
        || "-".into(),
        |p| {
            st.with_bounds(
                format!(
                    "{} {}",
                    units::signed_ns(p.value_ns),
                    units::precision_ns(p.precision_ns)
                ),
                label,
                false,
            )
        },
    )
}

/// The percentiles the sweep tables show.
const SHOWN: [&str; 4] = ["P50", "P90", "P99", "P99.9"];

/// The report's blocks and charts.
#[must_use]
pub fn blocks(r: &SweepReport) -> (Vec<Block>, Vec<Chart>) {
    let i = &r.info;
    let mut b = vec![Block::Heading(1, format!("Sweep {}", i.name))];
    let dims: Vec<&str> = i.dimensions.iter().map(|(d, _)| d.as_str()).collect();
    let mut bullets = vec![
        format!("Command: `{}`", i.command),
        format!("Machine: {}", i.machine),
        format!(
            "Broker: {} ({})",
            i.broker,
            r.cells
                .first()
                .map_or("not reached", |c| c.broker_version.as_str())
        ),
    ];
    if let Some(t) = &i.topics {
        bullets.push(format!("Topics: {t}"));
    }
    bullets.extend([
        format!(
            "Matrix: {} ({} cells, {} finished)",
            i.dimensions
                .iter()
                .map(|(d, v)| format!("{d} = {}", v.join(", ")))
                .collect::<Vec<_>>()
                .join("; "),
            i.dimensions.iter().map(|(_, v)| v.len()).product::<usize>(),
            r.cells.len()
        ),
        format!(
            "Each cell: {} warm-up, then a {} measured window: the traces due in the window (by their intended send time, so a publisher that falls behind cannot hide its backlog). Every part is a process of its own (`hoptrace soak`).",
            units::span_s(i.warmup_s),
            units::span_s(i.window_s)
        ),
        format!(
            "A cell holds when it achieved >= {KEEP_UP_RATIO} of its offered rate, every message of its window completed, and it met every service level: {}.",
            if i.slos.is_empty() {
                "none given".to_owned()
            } else {
                i.slos.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ")
            }
        ),
        "Percentiles: HdrHistogram, 3 significant digits, each with its precision (±, half its HDR bucket); min and max exact. The clock column bounds the error clocks add to a stage (0 where both hops read one host's clock). A stage that starts or ends at a polled hop (a store tap's) shows each percentile's bounds after it, `[lower, upper]`: where the true value lies given the polled stamps and the clocks; a service level inside them is undecided.".into(),
    ]);
    if r.cells.iter().any(|c| !c.adds_up) {
        bullets.push("WARNING: some cells' counts do not add up: see their reports.".into());
    }
    b.push(Block::Bullets(bullets));

    // Throughput and accounting per cell.
    b.push(Block::Heading(2, "Throughput".into()));
    let mut head: Vec<String> = dims.iter().map(|d| (*d).to_owned()).collect();
    head.extend(
        [
            "Offered metrics/s",
            "Achieved metrics/s",
            "Messages in window",
            "Complete",
            "Incomplete",
            "Completed msg/s per stage",
            "Publisher lag P99",
            "Holds",
        ]
        .map(str::to_owned),
    );
    let rows = r
        .cells
        .iter()
        .map(|c| {
            let mut row: Vec<String> = c.settings.iter().map(|s| s.value.clone()).collect();
            let per_stage = c
                .window
                .stages
                .iter()
                .map(|s| {
                    format!(
                        "{} {}",
                        s.name,
                        units::rate(s.figures.count as f64 / c.window.length_s().max(1e-9))
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            row.extend([
                units::rate(c.target_metrics_per_s as f64),
                units::rate(c.achieved_metrics_per_s()),
                units::count(c.window.messages),
                units::count(c.window.complete),
                units::count(c.lost()),
                per_stage,
                units::duration_ns(c.schedule_lag_p99_ns),
                why_not(c).map_or_else(|| "yes".into(), |w| format!("NO: {w}")),
            ]);
            row
        })
        .collect();
    b.push(Block::Table(head, rows));

    // Latency per stage.
    let stage_names: Vec<String> = r
        .cells
        .first()
        .map(|c| c.window.stages.iter().map(|s| s.name.clone()).collect())
        .unwrap_or_default();
    for name in &stage_names {
        b.push(Block::Heading(2, format!("Latency: {name}")));
        let mut head: Vec<String> = dims.iter().map(|d| (*d).to_owned()).collect();
        head.extend(["Achieved metrics/s", "Count"].map(str::to_owned));
        head.extend(SHOWN.map(str::to_owned));
        head.extend(["Max (exact)", "Clock ±"].map(str::to_owned));
        let rows = r
            .cells
            .iter()
            .filter_map(|c| c.window.stage(name).map(|st| (c, st)))
            .map(|(c, st)| {
                let mut row: Vec<String> = c.settings.iter().map(|s| s.value.clone()).collect();
                row.push(units::rate(c.achieved_metrics_per_s()));
                row.push(units::count(st.figures.count));
                row.extend(SHOWN.iter().map(|l| with_precision(st, l)));
                row.push(st.figures.max_ns.map_or_else(
                    || "-".into(),
                    |v| st.with_bounds(units::signed_ns(v), "Max", false),
                ));
                row.push(
                    st.clock_uncertainty_ns
                        .map_or_else(|| "unknown".into(), units::duration_ns),
                );
                row
            })
            .collect();
        b.push(Block::Table(head, rows));
    }

    // Knees and capacity.
    b.push(Block::Heading(
        2,
        "Knee: the highest rate that holds".into(),
    ));
    b.push(Block::Para(
        "Per series (every setting but the rate), the highest offered rate at which the cell held, every lower rate holding too.".into(),
    ));
    let mut head = vec![
        "Series".to_owned(),
        "Knee (offered metrics/s)".into(),
        "Achieved at the knee".into(),
        "First rate that did not hold".into(),
        "Why".into(),
    ];
    let capacity = i.capacity_target_metrics_per_s;
    if capacity.is_some() {
        head.push("Hosts needed".into());
    }
    let rows = r
        .knees
        .iter()
        .map(|k| {
            let mut row = vec![
                settings_label(&k.series),
                k.shown(),
                k.achieved_metrics_per_s
                    .map_or_else(|| "-".into(), units::rate),
                k.first_failing_shown(),
                k.failing_because.clone().unwrap_or_else(|| "-".into()),
            ];
            if let Some(t) = capacity {
                row.push(
                    k.achieved_metrics_per_s
                        .and_then(|a| hosts_needed(t as f64, a))
                        .map_or_else(|| "-".into(), |h| h.to_string()),
                );
            }
            row
        })
        .collect();
    b.push(Block::Table(head, rows));
    if let Some(t) = capacity {
        b.push(Block::Heading(2, "Capacity planning".into()));
        b.push(Block::Para(format!(
            "Hosts needed to carry {} metrics/s within the service levels = ceil({} / the per-host capacity at the knee). One host here is this machine running the whole pipeline (publisher, broker, processor, store, collector); the knee is a lower bound where every rate of the series held.",
            units::rate(t as f64),
            units::rate(t as f64)
        )));
    }

    // Resources.
    b.push(Block::Heading(2, "Resources".into()));
    let procs: Vec<String> = {
        let mut p: Vec<String> = Vec::new();
        for c in &r.cells {
            for x in &c.resources {
                if !p.contains(&x.process) {
                    p.push(x.process.clone());
                }
            }
        }
        p
    };
    let mut head: Vec<String> = dims.iter().map(|d| (*d).to_owned()).collect();
    head.extend(procs.iter().map(|p| format!("{p} CPU (cores) / RSS max")));
    let rows = r
        .cells
        .iter()
        .map(|c| {
            let mut row: Vec<String> = c.settings.iter().map(|s| s.value.clone()).collect();
            row.extend(procs.iter().map(|p| {
                c.resources.iter().find(|x| &x.process == p).map_or_else(
                    || "-".into(),
                    |x| format!("{:.2} / {} MiB", x.cpu_mean, x.rss_max_bytes >> 20),
                )
            }));
            row
        })
        .collect();
    b.push(Block::Table(head, rows));

    let charts = stage_names
        .iter()
        .enumerate()
        .map(|(n, s)| latency_vs_throughput(r, s, n))
        .collect::<Vec<_>>();
    b.push(Block::Heading(2, "Latency versus throughput".into()));
    for n in 0..charts.len() {
        b.push(Block::Chart(n));
    }
    b.push(Block::Heading(2, "Query the cells".into()));
    b.push(Block::Para(format!(
        "`hoptrace sql {}/runs \"SELECT c.*, hdr_percentile(t.total_ingestion_ns, 0.99) AS p99 FROM traces t JOIN cells c USING (run_id) WHERE t.intended_ns >= c.window_from AND t.intended_ns < c.window_to GROUP BY ALL\"` (the `cells` table: one row per cell, its settings as columns).",
        i.name
    )));
    (b, charts)
}

/// P50, P99 and P99.9 of `stage` against achieved throughput, a line per series.
fn latency_vs_throughput(r: &SweepReport, stage: &str, n: usize) -> Chart {
    let mut values = Vec::new();
    for c in &r.cells {
        let Some(st) = c.window.stage(stage) else {
            continue;
        };
        for label in ["P50", "P99", "P99.9"] {
            if let Some(p) = st.percentile(label) {
                values.push(json!({
                    "series": settings_label(&c.series()),
                    "percentile": label,
                    "offered": c.target_metrics_per_s,
                    "achieved": c.achieved_metrics_per_s(),
                    "latency_ms": p.value_ns as f64 / 1e6,
                    "precision_ms": p.precision_ns as f64 / 1e6,
                    "holds": c.holds(),
                }));
            }
        }
    }
    let title = format!("{stage}: latency versus throughput");
    let spec = charts::merge(
        charts::base(&title),
        json!({
            "data": {"values": values},
            "mark": {"type": "line", "point": true},
            "encoding": {
                "x": {"field": "achieved", "type": "quantitative", "title": "achieved metrics/s"},
                "y": {"field": "latency_ms", "type": "quantitative", "scale": {"type": "log"},
                      "title": "latency (ms, log)"},
                "color": {"field": "series", "type": "nominal", "title": "series"},
                "strokeDash": {"field": "percentile", "type": "nominal", "sort": ["P50", "P99", "P99.9"]},
                "shape": {"field": "holds", "type": "nominal", "title": "holds"},
                "tooltip": [{"field": "series"}, {"field": "percentile"},
                            {"field": "offered", "format": ",.0f"},
                            {"field": "achieved", "format": ",.0f"},
                            {"field": "latency_ms", "format": ".3f"},
                            {"field": "precision_ms", "format": ".4f", "title": "± ms"}]
            }
        }),
    );
    Chart {
        stem: format!("latency-vs-throughput-{n}"),
        title,
        spec,
    }
}

/// Writes `sweep.md`, `sweep.html`, `sweep.json` and the charts into `dir`.
///
/// # Errors
/// When a file cannot be written or the chart libraries are missing.
pub fn write(dir: &Path, r: &SweepReport) -> Result<Page, AnalysisError> {
    let (blocks, charts) = blocks(r);
    let page = report::write_page(
        dir,
        "sweep",
        &format!("Sweep {}", r.info.name),
        &blocks,
        &charts,
    )?;
    crate::write_file(
        &dir.join("sweep.json"),
        serde_json::to_vec_pretty(r).unwrap_or_default(),
    )?;
    Ok(page)
}

/// The `cells` table's rows as JSON objects (settings flattened), for [`crate::session`].
#[must_use]
pub fn cell_row(c: &Cell) -> Value {
    let mut row = json!({
        "run_id": c.run_id,
        "sweep": c.sweep,
        "cell": c.index,
        "target_metrics_per_s": c.target_metrics_per_s,
        "achieved_metrics_per_s": c.achieved_metrics_per_s(),
        "window_from": c.window.from_unix_ns,
        "window_to": c.window.to_unix_ns,
        "holds": c.holds(),
    });
    if let Some(o) = row.as_object_mut() {
        for s in &c.settings {
            o.insert(s.name.clone(), Value::String(s.value.clone()));
        }
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(rate: u64, acks: &str, p99_ns: u64, complete_of: (u64, u64)) -> Cell {
        let stage = StageSummary {
            name: "Total Ingestion".into(),
            column: "total_ingestion_ns".into(),
            from: "publish".into(),
            to: "store".into(),
            definition: String::new(),
            headline: true,
            figures: crate::summary::Figures {
                count: complete_of.0,
                negative: 0,
                clamped: 0,
                min_ns: Some(1),
                max_ns: Some(i64::try_from(p99_ns).unwrap()),
                mean_ns: Some(1.0),
                stddev_ns: Some(0.0),
                percentiles: vec![crate::summary::Percentile {
                    quantile: 0.99,
                    value_ns: i64::try_from(p99_ns).unwrap(),
                    precision_ns: p99_ns / 2000,
                }],
            },
            clock_uncertainty_ns: Some(0),
            clock_note: String::new(),
            clock_warning: false,
            poll_bracket: None,
            bounds: None,
            per_metric: None,
        };
        Cell {
            sweep: "s".into(),
            run_id: format!("s.r{rate}-{acks}"),
            index: 0,
            settings: vec![
                Setting {
                    name: RATE.into(),
                    value: rate.to_string(),
                },
                Setting {
                    name: "acks".into(),
                    value: acks.into(),
                },
            ],
            target_metrics_per_s: rate,
            metrics_per_message: 1,
            broker: String::new(),
            broker_version: String::new(),
            warmup_s: 1.0,
            window: WindowSummary {
                from_unix_ns: 0,
                to_unix_ns: 10_000_000_000,
                messages: complete_of.1,
                complete: complete_of.0,
                metrics: rate * 10,
                stages: vec![stage],
            },
            sent: complete_of.1,
            adds_up: true,
            drained: true,
            schedule_lag_p99_ns: 0,
            slos: vec![SloResult {
                slo: "Total Ingestion.p99 < 5ms".into(),
                met: p99_ns < 5_000_000,
                decision: None,
            }],
            resources: Vec::new(),
        }
    }

    #[test]
    fn the_knee_is_the_last_rate_before_the_first_that_fails() {
        let cells = vec![
            cell(1000, "1", 1_000_000, (10, 10)),
            cell(2000, "1", 2_000_000, (20, 20)),
            cell(4000, "1", 9_000_000, (40, 40)),
            cell(8000, "1", 1_000_000, (80, 80)),
            cell(1000, "all", 1_000_000, (10, 10)),
            cell(2000, "all", 1_000_000, (19, 20)),
        ];
        let k = knees(&cells);
        assert_eq!(k.len(), 2);
        assert_eq!(k[0].target_metrics_per_s, Some(2000));
        assert_eq!(k[0].first_failing_metrics_per_s, Some(4000));
        assert!(
            k[0].failing_because
                .as_deref()
                .unwrap()
                .contains("missed Total Ingestion.p99 < 5ms")
        );
        assert_eq!(k[1].target_metrics_per_s, Some(1000));
        assert!(
            k[1].failing_because
                .as_deref()
                .unwrap()
                .contains("1 messages incomplete")
        );
        assert_eq!(hosts_needed(1_000_000.0, 2000.0), Some(500));
        assert_eq!(hosts_needed(1_000_001.0, 2000.0), Some(501));
        assert_eq!(hosts_needed(1.0, 0.0), None);
    }

    /// A service level inside a cell's bounds is undecided: the knee becomes a range from
    /// the last rate proven to hold to the last one below the first that failed.
    #[test]
    fn undecided_cells_make_the_knee_a_range() {
        use crate::bounds::Decision;
        let with = |rate: u64, d: Decision| {
            let mut c = cell(rate, "1", 1_000_000, (10, 10));
            c.slos[0].decision = Some(d);
            c.slos[0].met = d == Decision::Met;
            c
        };
        let cells = vec![
            with(1000, Decision::Met),
            with(2000, Decision::Undecided),
            with(4000, Decision::Met),
            with(8000, Decision::Failed),
        ];
        let k = &knees(&cells)[0];
        assert_eq!(k.target_metrics_per_s, Some(1000));
        assert_eq!(k.undecided_metrics_per_s, [2000]);
        assert_eq!(k.upper_metrics_per_s, Some(4000));
        assert_eq!(k.first_failing_metrics_per_s, Some(8000));
        assert!(k.shown().contains("1.0k to 4.0k"), "{}", k.shown());
        assert_eq!(
            verdict(&cells[1]),
            Verdict::Undecided("undecided Total Ingestion.p99 < 5ms (inside its bounds)".into())
        );
        // Decided cells keep a point.
        let k = &knees(&[with(1000, Decision::Met), with(2000, Decision::Failed)])[0];
        assert_eq!(
            (k.target_metrics_per_s, k.upper_metrics_per_s),
            (Some(1000), None)
        );
        assert_eq!(k.shown(), "1.0k");
        assert_eq!(k.first_failing_shown(), "2.0k");
        // None failed, the last undecided: not "all held".
        let k = &knees(&[with(1000, Decision::Met), with(2000, Decision::Undecided)])[0];
        assert_eq!(k.first_failing_metrics_per_s, None);
        assert_eq!(
            k.first_failing_shown(),
            "none failed; undecided at 2.0k (the knee may lie above the sweep)"
        );
        let k = &knees(&[with(1000, Decision::Met)])[0];
        assert_eq!(
            k.first_failing_shown(),
            "all held (the knee is above the sweep)"
        );
    }

    /// A stage with a polled hop shows each percentile's bounds beside it; one without
    /// shows the percentile alone.
    #[test]
    fn bounded_percentiles_show_their_bounds() {
        use crate::bounds::{BoundFigures, StageBounds};
        let mut st = cell(1000, "1", 122_000_000, (10, 10))
            .window
            .stages
            .remove(0);
        assert_eq!(with_precision(&st, "P99"), "122.0ms ±61.0µs");
        let figures = |p99_ns: i64| BoundFigures {
            count: 10,
            min_ns: Some(1),
            max_ns: Some(p99_ns),
            mean_ns: Some(1.0),
            percentiles: vec![crate::summary::Percentile {
                quantile: 0.99,
                value_ns: p99_ns,
                precision_ns: 0,
            }],
            per_metric: None,
        };
        st.bounds = Some(StageBounds {
            polled: vec!["store".into()],
            lower_hops: ("publish".into(), "store_earliest".into()),
            upper_hops: ("publish".into(), "store".into()),
            lower: figures(42_000_000),
            upper: figures(122_000_000),
        });
        assert_eq!(
            with_precision(&st, "P99"),
            "122.0ms ±61.0µs [42.0ms, 122.0ms]"
        );
    }

    #[test]
    fn a_cell_that_falls_behind_does_not_hold() {
        let mut c = cell(1000, "1", 1_000_000, (10, 10));
        assert!(c.holds());
        c.window.metrics = 9_800; // 980/s of 1000/s
        assert!(!c.holds());
        assert!(why_not(&c).unwrap().contains("achieved"));
    }

    #[test]
    fn cell_rows_flatten_the_settings() {
        let row = cell_row(&cell(1000, "all", 1, (1, 1)));
        assert_eq!(row["acks"], "all");
        assert_eq!(row["rate"], "1000");
        assert_eq!(row["window_to"], 10_000_000_000i64);
    }
}
