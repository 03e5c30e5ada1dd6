//! `hoptrace sql`, `hoptrace report` and `hoptrace compare`.

use std::io::Write as _;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use hoptrace_analysis::bounds::Decision;
use hoptrace_analysis::compare::{self, Gate};
use hoptrace_analysis::sql::{self, OutputFormat};
use hoptrace_analysis::{RunSet, report};
use hoptrace_runner::query::{runtime, summarize, summarize_with};

use hoptrace_cli::analyze::{
    COMPARE_BAD_RUN, COMPARE_GATE_FAILED, COMPARE_UNDECIDED, COMPARE_USAGE, interactive,
    print_notes, run_list, split_query, stage_names, summary_lines,
};
pub use hoptrace_cli::analyze::{CompareArgs, ReportArgs, SqlArgs};
use hoptrace_cli::errors::exit_with;
use hoptrace_cli::out::{Sink, Stream};

/// `hoptrace sql`.
pub fn run_sql(args: &SqlArgs) -> Result<()> {
    let (paths, query) = split_query(&args.args);
    if paths.is_empty() {
        bail!("no run directory before the query: hoptrace sql RUN_DIR... \"SELECT ...\"");
    }
    let runs = args.read.open(&paths)?;
    let rt = runtime()?;
    rt.block_on(async {
        let ctx = runs.session().await?;
        let Some(q) = query else {
            return interactive(&ctx, args.format).await;
        };
        if args.format == OutputFormat::Parquet {
            let Some(out) = &args.out else {
                bail!("--format parquet needs --out FILE.parquet");
            };
            sql::write_parquet(&ctx, &q, out).await?;
            eprintln!("wrote {}", out.display());
            return Ok(());
        }
        let batches = sql::query(&ctx, &q).await?;
        match &args.out {
            Some(path) => {
                let mut f = std::fs::File::create(path)
                    .with_context(|| format!("creating {}", path.display()))?;
                sql::write(&batches, args.format, &mut f)?;
            }
            None => {
                let mut out = std::io::BufWriter::new(Sink(Stream::Out));
                sql::write(&batches, args.format, &mut out)?;
                out.flush()?;
            }
        }
        Ok(())
    })
}

/// `hoptrace report`.
pub fn run_report(args: &ReportArgs) -> Result<()> {
    let started = Instant::now();
    let runs = args.read.open(&args.runs)?;
    if runs.runs.len() > 1 && !args.merge {
        bail!(
            "{} runs found ({}): name one run directory, or pass --merge --out DIR to report them together as one",
            runs.runs.len(),
            run_list(&runs)
        );
    }
    if args.merge {
        eprintln!(
            "merging {} run(s) into one report: {}",
            runs.runs.len(),
            run_list(&runs)
        );
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| runs.runs[0].dir.join("report"));
    let (s, hists) = summarize_with(&runtime()?, &runs, args.exemplars)?;
    let written = report::write(&out, &s, &hists)?;
    print_summary(&s);
    eprintln!(
        "report: {} (and report.html, summary.json, {} chart(s){}) in {:.1} s",
        written.markdown.display(),
        written.charts.len(),
        if written.images {
            " with SVG images"
        } else {
            ", no images"
        },
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `hoptrace compare`: the gates are checked against the runs before anything is
/// printed; see [`CompareArgs`] for the exit statuses.
pub fn run_compare(args: &CompareArgs) -> Result<()> {
    if let Some(old) = args.fail_if.first() {
        return Err(exit_with(
            COMPARE_USAGE,
            anyhow::anyhow!(
                "--fail-if is now --require, which takes the condition a run must meet, as `sweep --sla` does (one meaning for one syntax): for --fail-if {old:?}, write --require with the opposite condition (e.g. --fail-if 'X.p99 > +10%' is --require 'X.p99 <= +10%')"
            ),
        ));
    }
    let gates: Vec<Gate> = args
        .require
        .iter()
        .map(|g| g.parse())
        .collect::<Result<_, _>>()
        .map_err(|e| exit_with(COMPARE_USAGE, e))?;
    let rt = runtime()?;
    let mut summaries = Vec::new();
    for dir in &args.runs {
        let runs =
            RunSet::open(std::slice::from_ref(dir)).map_err(|e| exit_with(COMPARE_BAD_RUN, e))?;
        print_notes(&runs);
        if runs.runs.len() > 1 {
            return Err(exit_with(
                COMPARE_USAGE,
                anyhow::anyhow!(
                    "{} holds {} runs ({}): compare takes one run directory per argument",
                    dir.display(),
                    runs.runs.len(),
                    run_list(&runs)
                ),
            ));
        }
        let s = summarize(&rt, &runs).map_err(|e| exit_with(COMPARE_BAD_RUN, e))?;
        summaries.push(s.0);
    }
    let base = &summaries[0];
    for (s, dir) in summaries.iter().zip(&args.runs).skip(1) {
        let shared = s
            .stages
            .iter()
            .filter(|st| base.stages.iter().any(|b| b.name == st.name))
            .count();
        if shared == 0 {
            eprintln!(
                "warning: {} shares no stage with the baseline {} (its stages: {}; the baseline's: {}): nothing to compare",
                dir.display(),
                args.runs[0].display(),
                stage_names(s),
                stage_names(base)
            );
        }
    }
    for g in &gates {
        g.check(&summaries)
            .map_err(|e| exit_with(COMPARE_USAGE, e))?;
    }
    let mut results = Vec::new();
    for g in &gates {
        results
            .extend(compare::evaluate(g, &summaries).map_err(|e| exit_with(COMPARE_BAD_RUN, e))?);
    }
    print!("{}", compare::table(&summaries));
    let (mut failed, mut undecided) = (0, 0);
    for r in &results {
        println!(
            "{} {:?} on {}: {}",
            match r.decision {
                Decision::Met => "pass",
                Decision::Failed => "FAIL",
                Decision::Undecided => "UNDECIDED",
            },
            r.gate,
            r.run_id,
            r.detail
        );
        failed += usize::from(r.decision == Decision::Failed);
        undecided += usize::from(r.decision == Decision::Undecided);
    }
    if failed > 0 {
        return Err(exit_with(
            COMPARE_GATE_FAILED,
            anyhow::anyhow!("{failed} requirement(s) not met (gate(s) failed)"),
        ));
    }
    if undecided > 0 {
        return Err(exit_with(
            COMPARE_UNDECIDED,
            anyhow::anyhow!(
                "{undecided} requirement(s) undecided: the bounds of a polled stage or the clocks' uncertainty hold them for some values and not for others (narrow the bounds: poll more often or with more pollers, read fewer series or rows a poll, or let the store notify each row, `notify=` on PostgreSQL)"
            ),
        ));
    }
    Ok(())
}

/// Prints a run's headline figures to stdout.
pub fn print_summary(s: &hoptrace_analysis::Summary) {
    for line in summary_lines(s) {
        println!("{line}");
    }
}
