//! `hoptrace sweep`: a matrix of settings (rate, metrics per message, MQTT QoS and
//! connections, Kafka acks and partitions), each cell a `hoptrace soak` of its own with
//! a warm-up and a fixed measured window; the sweep report with the knee of every series
//! and capacity planning. Finished cells are kept: the same command resumes an
//! interrupted sweep where it stopped.
//!
//! The sweep itself is `hoptrace_runner::sweep`; its options are `hoptrace_cli::soak`'s;
//! this prints what it returns.

use hoptrace_analysis::sweep;
pub use hoptrace_cli::soak::SweepArgs as Args;
use hoptrace_format::units;
use hoptrace_runner::sweep::SweepOptions;

/// Runs the sweep and prints every series' knee.
///
/// # Errors
/// Invalid options, a directory holding another sweep, a cell whose soak fails, or an
/// interruption (the finished cells are kept).
pub fn run(args: &Args) -> anyhow::Result<()> {
    let opts = SweepOptions::from_args(args)?;
    hoptrace_runner::sweep::check(&opts)?;
    let stop = hoptrace_cli::signals::shutdown_flag()?;
    let o = hoptrace_runner::sweep::run(&opts, &stop)?;
    // Columns as wide as their longest cell: a knee can be a range with words.
    let mut rows = vec![[
        "series".to_owned(),
        "knee".into(),
        "achieved".into(),
        "first that did not hold".into(),
    ]];
    rows.extend(sweep::knees(&o.cells).iter().map(|k| {
        [
            sweep::settings_label(&k.series),
            k.shown(),
            k.achieved_metrics_per_s
                .map_or_else(|| "-".into(), units::rate),
            match (k.first_failing_metrics_per_s, &k.failing_because) {
                (Some(r), Some(w)) => format!("{}: {w}", units::rate(r as f64)),
                _ => k.first_failing_shown(),
            },
        ]
    }));
    let width = |i: usize| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
    let (w0, w1, w2) = (width(0), width(1), width(2));
    for [series, knee, achieved, why] in &rows {
        println!("{series:<w0$}  {knee:>w1$}  {achieved:>w2$}  {why}");
    }
    println!(
        "Sweep: {} cells in {:.0} s ({} run now); report {}",
        o.cells.len(),
        o.elapsed_s,
        o.ran,
        o.out.join("sweep.md").display()
    );
    println!(
        "Query: hoptrace sql {} \"SELECT * FROM cells\"",
        o.runs_dir.display()
    );
    // A cell that does not hold is a finding; a cell whose counts do not add up is a
    // measurement that cannot be trusted.
    let bad: Vec<String> = o
        .cells
        .iter()
        .filter(|c| !c.adds_up)
        .map(|c| sweep::settings_label(&c.settings))
        .collect();
    if !bad.is_empty() {
        return Err(hoptrace_cli::errors::exit_with(
            crate::soak::SOAK_TARGET_MISSED,
            anyhow::anyhow!(
                "{} cell(s) whose counts do not add up: {} (see their reports under cells/)",
                bad.len(),
                bad.join("; ")
            ),
        ));
    }
    Ok(())
}
