//! The options of `hoptrace sql`, `hoptrace report` and `hoptrace compare`, the SQL
//! prompt, and the text of a run's headline figures.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use hoptrace_analysis::RunSet;
use hoptrace_analysis::session::OpenOptions;
use hoptrace_analysis::sql::{self, OutputFormat};

use crate::out::{Sink, Stream};

/// Arguments of `hoptrace sql`.
#[derive(Debug, clap::Args)]
pub struct SqlArgs {
    /// Run directories (or a directory of runs, or globs such as 'runs/*'), then the query.
    /// Tables: traces (with a <stage>_ns column per stage), traces_raw, clock, probes, runs,
    /// stages. Functions: hdr_histogram(ns), hdr_percentile(ns, q), hdr_precision(ns, q),
    /// hdr_merge(hist), hdr_value_at(hist, q), hdr_precision_at(hist, q), hdr_count(hist).
    /// Without a query, an interactive prompt reads one query per line.
    #[arg(required = true, num_args = 1..)]
    pub args: Vec<String>,
    /// Output format: table, csv, json (one object per line) or parquet.
    #[arg(long, short, default_value = "table")]
    pub format: OutputFormat,
    /// Where to write the result (a file) instead of stdout (required for parquet).
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub read: ReadArgs,
}

/// What to read beyond the default (shared by `sql` and `report`).
#[derive(Debug, clap::Args)]
pub struct ReadArgs {
    /// Read every copy of a run id: by default a run id met twice (a copied run
    /// directory) is read once, so that no trace counts twice.
    #[arg(long)]
    pub duplicates: bool,
    /// Read part files in a run's traces/ that its run.json does not list (by default
    /// they are left out, and named).
    #[arg(long)]
    pub unlisted: bool,
}

impl ReadArgs {
    /// Opens the runs, printing what was skipped or is dubious.
    ///
    /// # Errors
    /// A run that does not open.
    pub fn open<P: AsRef<std::path::Path>>(&self, paths: &[P]) -> Result<RunSet> {
        let runs = RunSet::open_with(
            paths,
            OpenOptions {
                duplicates: self.duplicates,
                unlisted: self.unlisted,
            },
        )?;
        print_notes(&runs);
        Ok(runs)
    }
}

/// Prints, on stderr, what opening runs skipped or left out.
pub fn print_notes(runs: &RunSet) {
    for n in &runs.notes {
        eprintln!("note: {n}");
    }
}

/// Arguments of `hoptrace report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Run directories to report on together (usually one).
    #[arg(required = true, num_args = 1..)]
    pub runs: Vec<PathBuf>,
    /// Where to write the report (a folder: report.md, report.html, summary.json,
    /// charts/; default: the run directory's report/; required with --merge).
    #[arg(long, short, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Report several runs (a folder of runs, or several directories) together, as one:
    /// their traces are merged into one set of statistics.
    #[arg(long, requires = "out")]
    pub merge: bool,
    /// How many of the slowest messages of each headline stage the report lists, each
    /// with its timeline (section "Tail Attribution"; 0 lists none).
    #[arg(
        long,
        value_name = "N",
        default_value_t = hoptrace_analysis::tail::DEFAULT_EXEMPLARS,
        value_parser = exemplars
    )]
    pub exemplars: usize,
    #[command(flatten)]
    pub read: ReadArgs,
}

/// `--exemplars`: 0 to the most the analysis lists.
fn exemplars(s: &str) -> Result<usize, String> {
    let max = hoptrace_analysis::tail::MAX_EXEMPLARS;
    s.parse::<usize>()
        .ok()
        .filter(|&n| n <= max)
        .ok_or_else(|| format!("the slowest messages to list per stage are 0 to {max}, not {s:?}"))
}

/// Exit status of `hoptrace compare` when a gate fails.
pub const COMPARE_GATE_FAILED: i32 = 1;
/// Exit status of `hoptrace compare` when the command is wrong (a malformed gate, a stage
/// no run has, a bad option).
pub const COMPARE_USAGE: i32 = 2;
/// Exit status of `hoptrace compare` when a run cannot be compared (missing, unreadable,
/// or without data for a gated stage).
pub const COMPARE_BAD_RUN: i32 = 3;
/// Exit status of `hoptrace compare` when no requirement failed but one is undecided: it
/// holds for some of the values the bounds allow (a polled stamp's, the clocks') and not
/// for others.
pub const COMPARE_UNDECIDED: i32 = 4;

/// Arguments of `hoptrace compare`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit status: 0 every requirement held (or none was given); 1 a \
requirement did not hold for a run; 2 the command is wrong (a malformed requirement, a \
stage or statistic the runs do not have, a bad option); 3 a run is missing, unreadable, or \
has no data for a required stage; 4 none failed but one is undecided (it holds for some of \
the values a polled stamp's bounds or the clocks' uncertainty allow and not for others). \
Requirements are checked against the runs before anything is printed."
)]
pub struct CompareArgs {
    /// Runs to compare, one run directory each; the first is the baseline.
    #[arg(required = true, num_args = 2..)]
    pub runs: Vec<PathBuf>,
    /// What every run must meet against the baseline, in the syntax of `sweep --sla`
    /// (a requirement: the run fails, exit 1, when it does not hold), e.g.
    /// 'Total Ingestion.p99 <= +10%', 'Broker Time.p99.9 < 5ms',
    /// 'Query Duration.mean <= +200us'. Repeatable.
    #[arg(long = "require", value_name = "REQUIREMENT")]
    pub require: Vec<String>,
    /// Renamed: `--require` takes the condition a run must meet (the opposite of what
    /// `--fail-if` took).
    #[arg(long = "fail-if", hide = true)]
    pub fail_if: Vec<String>,
}

/// Splits `args` into run paths and an optional trailing query: the last argument is a
/// query when it is not an existing path and reads like one (it holds a space, or starts
/// with a SQL keyword), so that a typo in the query is reported as a query error.
pub fn split_query(args: &[String]) -> (Vec<String>, Option<String>) {
    let looks_like_query = |s: &str| {
        let t = s.trim_start().to_ascii_lowercase();
        !std::path::Path::new(s).exists()
            && (s.contains(char::is_whitespace)
                || ["select", "with", "show", "describe", "explain", "values"]
                    .iter()
                    .any(|k| t.starts_with(k)))
    };
    match args.split_last() {
        Some((last, rest)) if looks_like_query(last) => (rest.to_vec(), Some(last.clone())),
        _ => (args.to_vec(), None),
    }
}

/// The interactive prompt of `hoptrace sql`: one query per line (`quit` or `exit` ends
/// it), each result written in `format`; an error is printed and the prompt goes on.
///
/// # Errors
/// Standard input or output fails.
pub async fn interactive(
    ctx: &hoptrace_analysis::datafusion::prelude::SessionContext,
    format: OutputFormat,
) -> Result<()> {
    let stdin = std::io::stdin();
    let tty = stdin.is_terminal();
    let prompt = || {
        if tty {
            print!("hoptrace> ");
            let _ = std::io::stdout().flush();
        }
    };
    prompt();
    for line in stdin.lock().lines() {
        let line = line?;
        let q = line.trim().trim_end_matches(';');
        if q.eq_ignore_ascii_case("quit") || q.eq_ignore_ascii_case("exit") {
            break;
        }
        if !q.is_empty() {
            let started = Instant::now();
            match sql::query(ctx, q).await {
                Ok(b) => {
                    let mut out = std::io::BufWriter::new(Sink(Stream::Out));
                    sql::write(&b, format, &mut out)?;
                    out.flush()?;
                    if tty {
                        println!("({:.3} s)", started.elapsed().as_secs_f64());
                    }
                }
                Err(e) => eprintln!("error: {}", crate::errors::render(&anyhow::Error::from(e))),
            }
        }
        prompt();
    }
    Ok(())
}

/// The runs' directories, comma-separated.
#[must_use]
pub fn run_list(runs: &RunSet) -> String {
    runs.runs
        .iter()
        .map(|r| r.dir.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A run's headline figures, one line each.
#[must_use]
pub fn summary_lines(s: &hoptrace_analysis::Summary) -> Vec<String> {
    let mut lines = Vec::new();
    use hoptrace_format::units::{count, duration_ns, precision_ns, rate, signed_ns};
    lines.push(format!(
        "{}: {} messages, {} metrics over {:.1} s ({} metrics/s)",
        s.pipeline,
        count(s.totals.messages),
        count(s.totals.metrics),
        s.totals.duration_s,
        rate(s.totals.metrics_per_s)
    ));
    for st in &s.stages {
        let p = |l: &str| {
            st.percentile(l).map_or_else(
                || "-".into(),
                |p| format!("{} {}", signed_ns(p.value_ns), precision_ns(p.precision_ns)),
            )
        };
        lines.push(format!(
            "  {:<18} n={:<12} p50 {:<18} p99 {:<18} p99.99 {:<18} clock ±{}",
            st.name,
            count(st.figures.count),
            p("P50"),
            p("P99"),
            p("P99.99"),
            st.clock_uncertainty_ns
                .map_or_else(|| "unknown".into(), duration_ns)
        ));
        if st.bounds.is_some() {
            // A polled hop: where the true figures lie, with the clocks' uncertainty.
            let b = |l: &str| {
                st.stat_interval(&l.to_ascii_lowercase(), false)
                    .map_or_else(
                        || "-".into(),
                        |(lo, hi)| {
                            format!(
                                "[{}, {}]",
                                hoptrace_format::units::duration_f64(lo),
                                hoptrace_format::units::duration_f64(hi)
                            )
                        },
                    )
            };
            lines.push(format!(
                "  {:<18} bounds  p50 {}  p99 {}  p99.99 {}  (polled stamps and clocks)",
                "",
                b("P50"),
                b("P99"),
                b("P99.99")
            ));
        }
    }
    for t in &s.tails {
        // The deepest tail the run has, and what took most of its time.
        if let Some((l, (c, share))) = t.levels.last().and_then(|l| Some((l, t.dominant(l)?))) {
            lines.push(format!(
                "  tail: {} {} ({} messages at or above {}): {:.0} % of its time is {}",
                t.stage,
                l.percentile.label(),
                count(l.messages),
                signed_ns(l.threshold_ns),
                share * 100.0,
                c.name
            ));
        }
    }
    let a = &s.accounting;
    // Said on the figures printed, and on every other finding of the accounting.
    let holds = a.sent == a.complete + a.incomplete + a.unseen;
    lines.push(format!(
        "  accounting: sent {} {} complete {} + incomplete {} + unseen {}: {}",
        count(a.sent),
        if holds { "=" } else { "!=" },
        count(a.complete),
        count(a.incomplete),
        count(a.unseen),
        if holds && a.adds_up {
            "adds up"
        } else {
            "DOES NOT ADD UP"
        }
    ));
    for w in &s.warnings {
        lines.push(format!("  warning: {w}"));
    }
    lines
}

/// The stages of a summary, comma-separated.
#[must_use]
pub fn stage_names(s: &hoptrace_analysis::Summary) -> String {
    s.stages
        .iter()
        .map(|st| st.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
