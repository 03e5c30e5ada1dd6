//! `hoptrace sweep`: a matrix of settings (rate, metrics per message, MQTT QoS and
//! connections, Kafka acks and partitions), each cell a `hoptrace soak` of its own with
//! a warm-up and a fixed measured window; the sweep report with the knee of every series
//! and capacity planning. Finished cells are kept: the same command resumes an
//! interrupted sweep where it stopped.
//!
//! The sweep itself is `hoptrace_runner::sweep`; this is its command line and what it
//! prints.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use hoptrace_analysis::sweep;
use hoptrace_format::units;
use hoptrace_runner::sweep::SweepOptions;

/// Options of `hoptrace sweep`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit status: 0 the sweep ran (cells that do not hold are findings, in the \
report); 3 a cell's counts do not add up (named); 1 any other failure."
)]
pub struct Args {
    /// Broker: `mqtt://host:port` or `kafka://host:port/topic` (with --partitions, the
    /// topic is the stem of `<topic>-p<N>`, created with N partitions if missing).
    #[arg(long)]
    pub broker: String,
    /// Offered rates, metrics per second (`10k,50k,100k`).
    #[arg(
        long,
        allow_negative_numbers = true,
        value_delimiter = ',',
        required = true
    )]
    pub rate: Vec<String>,
    /// Metrics per message: the message size (a JSON batch of this many metrics).
    #[arg(long, allow_negative_numbers = true, value_delimiter = ',')]
    pub metrics_per_message: Vec<u32>,
    /// MQTT QoS levels (`0,1`): publish and subscription.
    #[arg(long, value_delimiter = ',')]
    pub qos: Vec<u8>,
    /// MQTT client connections of the publisher (`1,4,16`).
    #[arg(long, value_delimiter = ',')]
    pub connections: Vec<u32>,
    /// Kafka producer acks (`1,all`).
    #[arg(long, value_delimiter = ',')]
    pub acks: Vec<String>,
    /// Kafka topic partitions (`1,3,6`): the processor consumes them all.
    #[arg(long, value_delimiter = ',')]
    pub partitions: Vec<u32>,
    /// Replicas of the topics the sweep creates (with --partitions; named
    /// `<topic>-p<N>-r<R>`): 3 on a 3-node cluster, so that acks=all waits for followers.
    #[arg(long, default_value_t = 1)]
    pub replication: u16,
    /// `min.insync.replicas` of the topics the sweep creates (with --partitions).
    #[arg(long)]
    pub min_insync_replicas: Option<u16>,
    /// Streams the load is spread over.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1000)]
    pub streams: u32,
    /// Left out of every cell's figures.
    #[arg(long, default_value = "5s", value_parser = units::parse_duration)]
    pub warmup: Duration,
    /// The measured window of every cell, after the warm-up.
    #[arg(long, default_value = "20s", value_parser = units::parse_duration)]
    pub window: Duration,
    /// A service level a cell must meet to hold (repeatable): `Total Ingestion.p99 < 5ms`.
    #[arg(long = "sla")]
    pub slas: Vec<String>,
    /// Size capacity planning for this load, metrics per second (`1M`).
    #[arg(long, allow_negative_numbers = true, value_parser = units::parse_count)]
    pub capacity_target: Option<u64>,
    /// The publisher's pacing tick (see `hoptrace soak --tick`; a unit is needed).
    #[arg(long, default_value = "500us", value_parser = units::parse_short_duration)]
    pub tick: Duration,
    /// Where to write the sweep (a folder: its report, and each cell's report and run;
    /// default: `runs/sweep-<Unix ms>`); one that holds a sweep of the same matrix is
    /// resumed.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub external: crate::soak::ExternalArgs,
}

impl Args {
    /// The sweep these options ask for.
    ///
    /// # Errors
    /// This program's path cannot be found.
    pub fn options(&self) -> anyhow::Result<SweepOptions> {
        if let Some(x) = self.external.external()? {
            x.check()?;
        }
        Ok(SweepOptions {
            soak_flags: self.external.soak_flags(),
            program: std::env::current_exe().context("this program's path")?,
            broker: self.broker.clone(),
            rate: self.rate.clone(),
            metrics_per_message: self.metrics_per_message.clone(),
            qos: self.qos.clone(),
            connections: self.connections.clone(),
            acks: self.acks.clone(),
            partitions: self.partitions.clone(),
            replication: self.replication,
            min_insync_replicas: self.min_insync_replicas,
            streams: self.streams,
            warmup: self.warmup,
            window: self.window,
            slas: self.slas.clone(),
            capacity_target: self.capacity_target,
            tick: self.tick,
            out: self.out.clone(),
            command: crate::units::command_line(),
        })
    }
}

/// Runs the sweep and prints every series' knee.
///
/// # Errors
/// Invalid options, a directory holding another sweep, a cell whose soak fails, or an
/// interruption (the finished cells are kept).
pub fn run(args: &Args) -> anyhow::Result<()> {
    let opts = args.options()?;
    hoptrace_runner::sweep::check(&opts)?;
    let stop = crate::signals::shutdown_flag()?;
    let o = hoptrace_runner::sweep::run(&opts, &stop)?;
    println!(
        "{:<50} {:>14} {:>14}  first that did not hold",
        "series", "knee", "achieved"
    );
    for k in sweep::knees(&o.cells) {
        println!(
            "{:<50} {:>14} {:>14}  {}",
            sweep::settings_label(&k.series),
            k.shown(),
            k.achieved_metrics_per_s
                .map_or_else(|| "-".into(), units::rate),
            match (k.first_failing_metrics_per_s, &k.failing_because) {
                (Some(r), Some(w)) => format!("{}: {w}", units::rate(r as f64)),
                _ => "-".into(),
            }
        );
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
        return Err(crate::errors::exit_with(
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

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::path::Path;

    use clap::Parser as _;

    use crate::{Cli, Command};

    /// The soak a sweep starts for `cell` (run `s.x`, under `out/`), as this program
    /// parses its command line.
    fn cell_soak(
        opts: &hoptrace_runner::sweep::SweepOptions,
        cell: &hoptrace_runner::sweep::Planned,
    ) -> crate::soak::Args {
        let line = hoptrace_runner::sweep::soak_args(
            opts,
            cell,
            "s.x",
            Path::new("out/runs"),
            Path::new("out/cells/x"),
        );
        let line = std::iter::once(OsString::from("hoptrace")).chain(line);
        let Command::Soak(soak) = Cli::try_parse_from(line).unwrap().command else {
            unreachable!("a soak")
        };
        soak
    }

    /// Each cell is a soak started with this program's own `soak` flags: they parse,
    /// with the values the sweep means.
    #[test]
    fn the_sweep_starts_its_soaks_with_flags_they_take() {
        let Command::Sweep(args) = Cli::parse_from([
            "hoptrace",
            "sweep",
            "--broker",
            "kafka://127.0.0.1:19092/t?linger_ms=1",
            "--rate",
            "10k,20k",
            "--acks",
            "all",
            "--partitions",
            "3",
            "--warmup",
            "2s",
            "--window",
            "3s",
            "--tick",
            "1ms",
            "--streams",
            "7",
        ])
        .command
        else {
            unreachable!("a sweep")
        };
        let opts = args.options().unwrap();
        let checked = hoptrace_runner::sweep::check(&opts).unwrap();
        let soak = cell_soak(&opts, &checked.cells()[1]);
        assert_eq!(
            soak.broker,
            "kafka://127.0.0.1:19092/t-p3?linger_ms=1&acks=all"
        );
        assert_eq!(soak.rate, 20_000);
        assert_eq!(soak.duration, opts.warmup + opts.window);
        assert_eq!((soak.warmup, soak.tick), (opts.warmup, opts.tick));
        assert_eq!((soak.streams, soak.metrics_per_message), (7, 50));
        assert_eq!(soak.run_id.as_deref(), Some("s.x"));
        assert_eq!(soak.runs, Path::new("out/runs"));
        assert_eq!(soak.out.as_deref(), Some(Path::new("out/cells/x")));
        assert!(soak.external.pipeline.is_none());
    }

    /// A sweep of an external pipeline gives every cell's soak the same pipeline, taps
    /// and watched ports.
    #[test]
    fn a_sweep_of_an_external_pipeline_passes_it_to_every_soak() {
        let tap =
            "--from influxdb://127.0.0.1:18086/hoptrace?measurement=nodered --poll-interval 20ms";
        let Command::Sweep(args) = Cli::parse_from([
            "hoptrace",
            "sweep",
            "--broker",
            "mqtt://127.0.0.1:11883/hoptrace/nr/in/sweep?version=5",
            "--rate",
            "1k,2k",
            "--pipeline",
            "tap/testdata/nodered-influxdb.toml",
            "--tap",
            tap,
            "--watch-port",
            "18086",
            "--payload-context",
        ])
        .command
        else {
            unreachable!("a sweep")
        };
        let opts = args.options().unwrap();
        let checked = hoptrace_runner::sweep::check(&opts).unwrap();
        let soak = cell_soak(&opts, &checked.cells()[0]);
        let x = soak.external;
        assert_eq!(
            x.pipeline.as_deref(),
            Some(Path::new("tap/testdata/nodered-influxdb.toml"))
        );
        assert_eq!(x.taps, [tap]);
        assert_eq!(x.watch_ports, [18086]);
        assert!(x.payload_context);
        assert_eq!(x.topic_root, None);
        // A bad tap is refused before any cell runs.
        let Command::Sweep(args) = Cli::parse_from([
            "hoptrace",
            "sweep",
            "--broker",
            "mqtt://127.0.0.1:11883",
            "--rate",
            "1k",
            "--pipeline",
            "tap/testdata/nodered-influxdb.toml",
        ])
        .command
        else {
            unreachable!("a sweep")
        };
        let e = args.options().unwrap_err().to_string();
        assert!(e.contains("at least one --tap"), "{e}");
    }
}
