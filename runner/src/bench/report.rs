//! `hoptrace bench report`: the time and peak memory of `hoptrace report` over large
//! generated runs, side by side with DuckDB computing the same stage statistics exactly
//! on the same Parquet files.
//!
//! For each size a run is generated (the collector's own Parquet writer, realistic
//! delays: see `hoptrace_collector::generate`), then `hoptrace report` runs on it as a child
//! process, then `runner/bench/duckdb_stages.py` (embedded in the binary) runs DuckDB's exact
//! `quantile_disc` per stage. Wall time and peak RSS of both children come from the
//! kernel (`wait4`). Every DuckDB figure is checked against the report: counts, minimum
//! and maximum exactly, every percentile within the precision the report states.

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Instant;

use anyhow::{Context as _, bail};
use hoptrace_analysis::Summary;
use hoptrace_collector::generate::{GenerateOptions, generate};
use serde::{Deserialize, Serialize};

use hoptrace_format::run::HostInfo;
use hoptrace_format::units;

use crate::progress::LiveLine;

/// The DuckDB side, run by `python3`.
const DUCKDB_SCRIPT: &str = include_str!("../../bench/duckdb_stages.py");

/// What to measure.
#[derive(Debug, Clone)]
pub struct ReportBenchOptions {
    /// The `hoptrace` program whose `report` is timed.
    pub program: PathBuf,
    /// Run sizes in traces.
    pub traces: Vec<u64>,
    /// Where generated runs, reports and DuckDB's answers go.
    pub dir: PathBuf,
    /// Keep each generated run (a later invocation reuses a run of the same size).
    pub keep: bool,
    /// Rows per generated Parquet file.
    pub rows_per_file: u64,
    /// Most messages per processor batch in the generated runs (1: every hop stamped
    /// per message).
    pub batch_max: u32,
    /// Python with the `duckdb` package.
    pub python: String,
    /// Skip DuckDB (only time the report).
    pub no_duckdb: bool,
}

/// Wall time and peak resident memory of a finished child process.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Measured {
    /// Seconds from spawn to exit.
    pub wall_s: f64,
    /// CPU seconds (user + system).
    pub cpu_s: f64,
    /// Peak resident set, bytes.
    pub peak_rss_bytes: u64,
}

/// Runs `cmd` to completion and measures it.
///
/// # Errors
/// The command cannot start, or exits unsuccessfully.
pub fn run_measured(cmd: &mut Command) -> anyhow::Result<Measured> {
    let started = Instant::now();
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
    let pid = libc::pid_t::try_from(child.id()).context("child pid")?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pid is our own unwaited child; status and usage are valid pointers.
    let r = unsafe { libc::wait4(pid, &raw mut status, 0, &raw mut usage) };
    if r != pid {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    let wall_s = started.elapsed().as_secs_f64();
    let status = ExitStatus::from_raw(status);
    if !status.success() {
        bail!("{:?} failed: {status}", cmd.get_program());
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Measured {
        wall_s,
        cpu_s: secs(usage.ru_utime) + secs(usage.ru_stime),
        // ru_maxrss is in KiB on Linux.
        peak_rss_bytes: u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024,
    })
}

/// DuckDB's answers, as the script writes them.
#[derive(Debug, Clone, Deserialize, Serialize)]
struct DuckAnswer {
    duckdb_version: String,
    threads: Option<u64>,
    query_s: f64,
    stages: Vec<DuckStage>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
struct DuckStage {
    name: String,
    count: u64,
    negative: u64,
    min_ns: Option<i64>,
    max_ns: Option<i64>,
    mean_ns: Option<f64>,
    stddev_ns: Option<f64>,
    quantiles: Vec<f64>,
    values_ns: Vec<i64>,
}

/// One size's figures.
#[derive(Debug, Clone, Serialize)]
pub struct SizeResult {
    /// Traces in the run.
    pub traces: u64,
    /// Most messages per processor batch of the generated run.
    pub batch_max: u32,
    /// Parquet files and bytes.
    pub files: usize,
    /// Bytes of Parquet.
    pub parquet_bytes: u64,
    /// Seconds the generator took (0 when reused).
    pub generate_s: f64,
    /// `hoptrace report`.
    pub report: Measured,
    /// DuckDB (the Python process: start, import, queries).
    pub duckdb: Option<Measured>,
    /// DuckDB's own query time, seconds.
    pub duckdb_query_s: Option<f64>,
    /// DuckDB's version.
    pub duckdb_version: Option<String>,
    /// Report wall time / DuckDB wall time.
    pub ratio: Option<f64>,
    /// Percentiles compared, and how many were outside the stated precision.
    pub percentiles_checked: usize,
    /// Disagreements (empty when every figure agrees).
    pub disagreements: Vec<String>,
}

/// What `hoptrace bench report` prints as JSON.
#[derive(Debug, Clone, Serialize)]
pub struct ReportBench {
    /// The machine.
    pub machine: HostInfo,
    /// One result per size.
    pub results: Vec<SizeResult>,
}

impl ReportBench {
    /// Whether DuckDB and the report agree on every figure of every size.
    #[must_use]
    pub fn agrees(&self) -> bool {
        self.results.iter().all(|r| r.disagreements.is_empty())
    }
}

/// Runs the benchmark for every size; `on_size` sees each size's figures as they are
/// done.
///
/// # Errors
/// A failed generation, report or DuckDB run.
pub fn run(
    opts: &ReportBenchOptions,
    mut on_size: impl FnMut(&SizeResult),
) -> anyhow::Result<ReportBench> {
    std::fs::create_dir_all(&opts.dir)
        .with_context(|| format!("cannot create {}", opts.dir.display()))?;
    let script = opts.dir.join("duckdb_stages.py");
    std::fs::write(&script, DUCKDB_SCRIPT)
        .with_context(|| format!("cannot write {}", script.display()))?;
    let mut results = Vec::new();
    for &traces in &opts.traces {
        let r = one_size(opts, traces, &script)?;
        on_size(&r);
        results.push(r);
    }
    Ok(ReportBench {
        machine: hoptrace_collector::run::host_info(),
        results,
    })
}

fn one_size(args: &ReportBenchOptions, traces: u64, script: &Path) -> anyhow::Result<SizeResult> {
    // The shape is in the name, so a kept run of another shape is not reused.
    let run_id = format!("generated-{traces}-batch{}", args.batch_max);
    let run_dir = args.dir.join(&run_id);
    let (files, parquet_bytes, generate_s) = match reusable(&run_dir, traces) {
        Some((files, bytes)) => {
            eprintln!(
                "bench report: reusing {} ({traces} traces)",
                run_dir.display()
            );
            (files, bytes, 0.0)
        }
        None => {
            if run_dir.exists() {
                hoptrace_collector::generate::remove(&run_dir)?;
            }
            let mut opts = GenerateOptions::new(traces, &args.dir, &run_id);
            opts.rows_per_file = args.rows_per_file;
            opts.batch_max = args.batch_max;
            let mut live = LiveLine::new();
            let g = generate(&opts, |p| {
                let rate = p.traces as f64 / p.elapsed_s.max(1e-9);
                live.show(&format!(
                    "generate: {}/{} traces  {}/s  ETA {:.0} s",
                    p.traces,
                    traces,
                    units::rate(rate),
                    (traces - p.traces) as f64 / rate
                ));
            })?;
            live.finish();
            eprintln!(
                "generate: {} traces in {} files, {:.1} MiB ({:.2} bytes/trace) in {:.1} s",
                g.traces,
                g.files,
                g.bytes as f64 / 1_048_576.0,
                g.bytes as f64 / g.traces.max(1) as f64,
                g.elapsed_s
            );
            (g.files, g.bytes, g.elapsed_s)
        }
    };

    let report_dir = args.dir.join(format!("{run_id}-report"));
    eprintln!("bench report: hoptrace report over {traces} traces ...");
    let report = run_measured(
        Command::new(&args.program)
            .arg("report")
            .arg(&run_dir)
            .arg("--out")
            .arg(&report_dir)
            .stdout(std::process::Stdio::null()),
    )?;
    eprintln!(
        "bench report: report in {:.1} s, peak RSS {} MiB",
        report.wall_s,
        report.peak_rss_bytes >> 20
    );
    let summary: Summary = serde_json::from_slice(
        &std::fs::read(report_dir.join("summary.json")).context("the report's summary.json")?,
    )
    .context("the report's summary.json")?;
    let mut result = SizeResult {
        traces,
        batch_max: args.batch_max,
        files,
        parquet_bytes,
        generate_s,
        report,
        duckdb: None,
        duckdb_query_s: None,
        duckdb_version: None,
        ratio: None,
        percentiles_checked: 0,
        disagreements: Vec::new(),
    };
    if summary.totals.messages != traces || summary.accounting.sent != traces {
        result.disagreements.push(format!(
            "the report read {} messages ({} sent) of {traces} generated",
            summary.totals.messages, summary.accounting.sent
        ));
    }
    if !args.no_duckdb {
        eprintln!("bench report: DuckDB over the same files ...");
        let answer_path = args.dir.join(format!("{run_id}-duckdb.json"));
        let duck = run_measured(
            Command::new(&args.python)
                .arg(script)
                .arg(&run_dir)
                .arg(report_dir.join("summary.json"))
                .arg(&answer_path),
        )
        .context("DuckDB (is the duckdb Python package installed? pip install duckdb)")?;
        let answer: DuckAnswer =
            serde_json::from_slice(&std::fs::read(&answer_path).context("DuckDB's answers")?)
                .context("DuckDB's answers")?;
        eprintln!(
            "bench report: DuckDB in {:.1} s (queries {:.1} s), peak RSS {} MiB",
            duck.wall_s,
            answer.query_s,
            duck.peak_rss_bytes >> 20
        );
        let (checked, disagreements) = agree(&summary, &answer);
        result.percentiles_checked = checked;
        result.disagreements.extend(disagreements);
        result.ratio = Some(report.wall_s / duck.wall_s);
        result.duckdb = Some(duck);
        result.duckdb_query_s = Some(answer.query_s);
        result.duckdb_version = Some(answer.duckdb_version);
    }
    if !args.keep {
        hoptrace_collector::generate::remove(&run_dir)?;
    }
    Ok(result)
}

/// Files and bytes of an existing generated run of exactly `traces` traces.
fn reusable(run_dir: &Path, traces: u64) -> Option<(usize, u64)> {
    let bytes = std::fs::read(run_dir.join("run.json")).ok()?;
    let s: hoptrace_format::run::RunSummary = serde_json::from_slice(&bytes).ok()?;
    let rows: u64 = s.files.iter().map(|f| f.rows).sum();
    let all_there = s.files.iter().all(|f| {
        std::fs::metadata(run_dir.join("traces").join(&f.name)).is_ok_and(|m| m.len() == f.bytes)
    });
    (rows == traces && all_there).then(|| (s.files.len(), s.files.iter().map(|f| f.bytes).sum()))
}

/// Checks DuckDB's exact figures against the report's: counts, minimum and maximum
/// exactly, each percentile within its stated precision. Returns the percentiles checked
/// and every disagreement.
fn agree(summary: &Summary, duck: &DuckAnswer) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut bad = Vec::new();
    for st in &summary.stages {
        let Some(d) = duck.stages.iter().find(|d| d.name == st.name) else {
            bad.push(format!("{}: DuckDB has no such stage", st.name));
            continue;
        };
        if (
            st.figures.count,
            st.figures.negative,
            st.figures.min_ns,
            st.figures.max_ns,
        ) != (d.count, d.negative, d.min_ns, d.max_ns)
        {
            bad.push(format!(
                "{}: count/negative/min/max {:?} vs DuckDB {:?}",
                st.name,
                (
                    st.figures.count,
                    st.figures.negative,
                    st.figures.min_ns,
                    st.figures.max_ns
                ),
                (d.count, d.negative, d.min_ns, d.max_ns)
            ));
        }
        for (p, (&q, &exact)) in st
            .figures
            .percentiles
            .iter()
            .zip(d.quantiles.iter().zip(&d.values_ns))
        {
            checked += 1;
            let diff = (i128::from(p.value_ns) - i128::from(exact)).unsigned_abs();
            if (p.quantile - q).abs() > 1e-12 || diff > u128::from(p.precision_ns) {
                bad.push(format!(
                    "{} {}: hoptrace {} ± {} ns, DuckDB {exact} ns",
                    st.name,
                    p.label(),
                    p.value_ns,
                    p.precision_ns
                ));
            }
        }
    }
    (checked, bad)
}
