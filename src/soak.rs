//! `hoptrace soak`: the whole pipeline as separate processes (collector, reference store,
//! reference processor, publisher) through a real broker at a target rate for a duration,
//! with the CPU and RSS of every process (the broker's included) sampled every second;
//! then the report, with a resource section and the soak's targets, each met or not.
//!
//! The soak itself is `hoptrace_runner::soak`; this is its command line and what it
//! prints.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use hoptrace_format::units;
use hoptrace_runner::soak::{self, SoakOptions};

/// Options of `hoptrace soak`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Broker the pipeline runs through: `mqtt://host:port` or `kafka://host:port/topic`
    /// (the topic must exist; give it partitions for the processor to keep up).
    #[arg(long)]
    pub broker: String,
    /// Target rate, metrics per second (open loop).
    #[arg(long, default_value = "1M", value_parser = units::parse_count)]
    pub rate: u64,
    /// How long to publish.
    #[arg(long, default_value = "30m", value_parser = units::parse_duration)]
    pub duration: Duration,
    /// Metrics per message (a JSON batch): choose what the broker can carry.
    #[arg(long, default_value_t = 50)]
    pub metrics_per_message: u32,
    /// Streams (topics, or Kafka keys) the load is spread over.
    #[arg(long, default_value_t = 3000)]
    pub streams: u32,
    /// Zipf exponent of the per-stream rates (0: uniform).
    #[arg(long, default_value_t = 0.0)]
    pub zipf: f64,
    /// The processor writes a batch once it holds this many rows...
    #[arg(long, default_value_t = 2000)]
    pub batch_rows: usize,
    /// ...or once its first row has waited this long.
    #[arg(long, default_value = "1ms", value_parser = units::parse_duration)]
    pub linger: Duration,
    /// The publisher's pacing tick (`hoptrace publish --tick`): it wakes at most once per
    /// tick and sends what is due by its end, so the load generator leaves the machine's
    /// cores to the pipeline under test. The schedule lag it adds is reported.
    #[arg(long, default_value = "500us", value_parser = units::parse_duration)]
    pub tick: Duration,
    /// Left out of the resource means and the RSS flatness judgement.
    #[arg(long, default_value = "60s", value_parser = units::parse_duration)]
    pub warmup: Duration,
    /// Directory under which the run directory is written.
    #[arg(long, default_value = "runs")]
    pub runs: PathBuf,
    /// Where the report and the children's logs go (default: `<runs>/<run id>-report`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run id (default: `soak-<Unix ms>`); letters, digits, `.`, `_` and `-`.
    #[arg(long, value_parser = crate::units::parse_run_id)]
    pub run_id: Option<String>,
    #[command(flatten)]
    pub preflight: crate::clock::PreflightArgs,
}

impl Args {
    /// The soak these options ask for.
    ///
    /// # Errors
    /// This program's path cannot be found.
    pub fn options(&self) -> anyhow::Result<SoakOptions> {
        Ok(SoakOptions {
            program: std::env::current_exe().context("this program's path")?,
            broker: self.broker.clone(),
            rate: self.rate,
            duration: self.duration,
            metrics_per_message: self.metrics_per_message,
            streams: self.streams,
            zipf: self.zipf,
            batch_rows: self.batch_rows,
            linger: self.linger,
            tick: self.tick,
            warmup: self.warmup,
            runs: self.runs.clone(),
            out: self.out.clone(),
            run_id: self.run_id.clone(),
            max_clock_error_ns: self.preflight.max_clock_error,
            command: crate::units::command_line(),
        })
    }
}

/// Runs the soak and prints the children's summaries, the run's figures, the targets
/// and the resources.
///
/// # Errors
/// Invalid options, a part that does not start or fails, a report that cannot be written,
/// or counts that do not add up.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let opts = args.options()?;
    opts.check()?;
    let stop = crate::signals::shutdown_flag()?;
    args.preflight.check()?;
    let measured = soak::measure(&opts, &stop)?;
    for line in &measured.output {
        println!("{line}");
    }
    if measured.interrupted {
        eprintln!(
            "interrupted: published for {:.0} s of the planned {:.0} s; the run and its report say so",
            measured.published.elapsed_ns as f64 / 1e9,
            args.duration.as_secs_f64()
        );
    }
    let o = soak::report(&opts, measured)?;
    println!();
    crate::analyze::print_summary(&o.summary);
    println!();
    for t in &o.result.targets {
        println!(
            "{:<58} {:<22} {:<60} {}",
            t.name,
            t.target,
            t.measured,
            if t.met { "met" } else { "MISSED" }
        );
    }
    for p in &o.result.resources {
        println!(
            "{:<24} CPU {:.2} cores (max {:.2}), RSS mean {} MiB max {} MiB, slope {:.1} MiB/min{}",
            p.process,
            p.cpu_mean,
            p.cpu_max,
            p.rss_mean_bytes >> 20,
            p.rss_max_bytes >> 20,
            p.rss_slope_bytes_per_min / 1_048_576.0,
            if p.rss_flat { "" } else { " (growing)" }
        );
    }
    println!("Run directory: {}", o.run_dir.display());
    println!(
        "Report: {} (also report.html, summary.json, soak.json, logs/)",
        o.report.display()
    );
    if !o.summary.accounting.adds_up {
        bail!("the run's accounting does not add up: see the report");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use clap::Parser as _;
    use hoptrace_runner::soak::{Addresses, PartCommands, Plan};

    use crate::{Cli, Command};

    fn parse(args: &[OsString]) -> Command {
        let line = std::iter::once(OsString::from("hoptrace")).chain(args.iter().cloned());
        Cli::try_parse_from(line)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
            .command
    }

    /// The soak's children are this program's own commands: the flags the soak gives
    /// them are flags they take, with the values the soak means.
    #[test]
    fn the_soak_starts_its_parts_with_flags_they_take() {
        let Command::Soak(args) = Cli::parse_from([
            "hoptrace",
            "soak",
            "--broker",
            "mqtt://127.0.0.1:1883",
            "--rate",
            "2k",
            "--duration",
            "90s",
            "--linger",
            "2ms",
            "--tick",
            "250us",
            "--zipf",
            "1.1",
            "--max-clock-error",
            "1ms",
        ])
        .command
        else {
            unreachable!("a soak")
        };
        let opts = args.options().unwrap();
        let plan = Plan {
            run_id: "s1".into(),
            run_dir: "runs/s1".into(),
            out: "out".into(),
            logs: "out/logs".into(),
            topic_root: "hoptrace-soak/s1".into(),
            publisher_json: "out/publisher.json".into(),
        };
        let at = Addresses {
            collector: "127.0.0.1:7401".into(),
            metrics: "127.0.0.1:7402".parse().unwrap(),
            store: "127.0.0.1:7403".into(),
        };
        let cmds = PartCommands::new(&opts, &plan, &at, true);
        let Command::Collect(c) = parse(&cmds.collector) else {
            unreachable!("collect")
        };
        assert_eq!(c.listen.as_deref(), Some("127.0.0.1:7401"));
        assert_eq!(c.metrics.as_deref(), Some("127.0.0.1:7402"));
        assert_eq!(c.run_id.as_deref(), Some("s1"));
        assert_eq!(c.runs, opts.runs);
        assert_eq!(c.preflight.max_clock_error, Some(1_000_000));
        assert!(c.preflight.force_clock);
        let Command::Refpipe(crate::refpipe_cmd::Which::Store(s)) = parse(&cmds.store) else {
            unreachable!("refpipe store")
        };
        assert_eq!(s.listen, "127.0.0.1:7403");
        assert_eq!(s.collector.collector.as_deref(), Some("127.0.0.1:7401"));
        let Command::Refpipe(crate::refpipe_cmd::Which::Processor(p)) = parse(&cmds.processor)
        else {
            unreachable!("refpipe processor")
        };
        assert_eq!(p.from, "mqtt://127.0.0.1:1883");
        assert_eq!(p.store, "127.0.0.1:7403");
        assert_eq!(p.topics, ["hoptrace-soak/s1/#"]);
        assert_eq!((p.batch_rows, p.linger), (opts.batch_rows, opts.linger));
        let Command::Publish(p) = parse(&cmds.publisher) else {
            unreachable!("publish")
        };
        assert_eq!(p.to, "mqtt://127.0.0.1:1883");
        assert_eq!(p.rate, 2000.0);
        assert_eq!(
            (p.duration, p.tick, p.zipf),
            (opts.duration, opts.tick, 1.1)
        );
        assert_eq!(
            (p.streams, p.metrics_per_message),
            (opts.streams, opts.metrics_per_message)
        );
        assert_eq!(p.topic_root.as_deref(), Some("hoptrace-soak/s1"));
        assert_eq!(p.summary_json, Some(plan.publisher_json));
        assert_eq!(p.collector.collector.as_deref(), Some("127.0.0.1:7401"));
    }
}
