//! `hoptrace soak`: the whole pipeline as separate processes (collector, reference store,
//! reference processor, publisher) through a real broker at a target rate for a duration,
//! with the CPU and RSS of every process (the broker's included) sampled every second;
//! then the report, with a resource section and the soak's targets, each met or not.
//!
//! The soak itself is `hoptrace_runner::soak`; this is its command line and what it
//! prints.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use hoptrace_format::units;
use hoptrace_runner::soak::{self, External, SoakOptions};

/// Options of `hoptrace soak`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit status: 0 every target met; 3 the run was measured and reported but a \
target was missed (the line names it); 1 any other failure (options, a part that does not \
start or fails, a report that cannot be written)."
)]
pub struct Args {
    /// Broker the pipeline runs through: `mqtt://host:port[/prefix]` or
    /// `kafka://host:port/topic` (the topic must exist; give it partitions for the
    /// processor to keep up). An MQTT address's path is the first levels of every topic:
    /// the publisher publishes under it and the reference processor subscribes under it.
    #[arg(long)]
    pub broker: String,
    /// Target rate, metrics per second (open loop).
    #[arg(long, allow_negative_numbers = true, default_value = "1M", value_parser = units::parse_count)]
    pub rate: u64,
    /// How long to publish.
    #[arg(long, default_value = "30m", value_parser = units::parse_duration)]
    pub duration: Duration,
    /// Metrics per message (a JSON batch): choose what the broker can carry.
    #[arg(long, allow_negative_numbers = true, default_value_t = 50)]
    pub metrics_per_message: u32,
    /// Streams (topics, or Kafka keys) the load is spread over.
    #[arg(long, allow_negative_numbers = true, default_value_t = 3000)]
    pub streams: u32,
    /// Zipf exponent of the per-stream rates (0: uniform).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    pub zipf: f64,
    /// The processor writes a batch once it holds this many rows...
    #[arg(long, default_value_t = 2000)]
    pub batch_rows: usize,
    /// ...or once its first row has waited this long (a unit is needed: `1ms`, `500us`).
    #[arg(long, default_value = "1ms", value_parser = units::parse_short_duration)]
    pub linger: Duration,
    /// The publisher's pacing tick (`hoptrace publish --tick`): it wakes at most once per
    /// tick and sends what is due by its end, so the load generator leaves the machine's
    /// cores to the pipeline under test. The schedule lag it adds is reported. A unit is
    /// needed (`500us`, `1ms`).
    #[arg(long, default_value = "500us", value_parser = units::parse_short_duration)]
    pub tick: Duration,
    /// Left out of the resource means and the RSS flatness judgement.
    #[arg(long, default_value = "60s", value_parser = units::parse_duration)]
    pub warmup: Duration,
    /// Folder under which the run directory `<run-id>/` is created.
    #[arg(long, value_name = "DIR", default_value = "runs")]
    pub runs: PathBuf,
    /// Where to write the report (a folder: the report, soak.json and the children's
    /// logs; default: `<runs>/<run id>-report`).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Run id (default: `soak-<Unix ms>`); letters, digits, `.`, `_` and `-`.
    #[arg(long, value_parser = crate::units::parse_run_id)]
    pub run_id: Option<String>,
    #[command(flatten)]
    pub external: ExternalArgs,
    #[command(flatten)]
    pub preflight: crate::clock::PreflightArgs,
    /// Serve the collector's live view at http://HOST:PORT/ while the soak runs
    /// (`hoptrace collect --ui`), with --rate as its target; `:0` picks a free port.
    #[arg(long, value_name = "HOST:PORT", value_parser = crate::units::parse_listen)]
    pub ui: Option<String>,
}

impl Args {
    /// The soak these options ask for.
    ///
    /// # Errors
    /// This program's path cannot be found.
    pub fn options(&self) -> anyhow::Result<SoakOptions> {
        Ok(SoakOptions {
            external: self.external.external()?,
            topic_root: self.external.topic_root.clone(),
            payload_context: self.external.payload_context,
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
            ui: self.ui.clone(),
            command: crate::units::command_line(),
        })
    }
}

/// How a soak (or every cell of a sweep) runs against an external pipeline.
#[derive(Debug, Clone, clap::Args)]
pub struct ExternalArgs {
    /// Measure an external pipeline (one hoptrace did not start: Node-RED, a store's
    /// Kafka engine, ...) described by this pipeline spec, instead of the reference
    /// processor and store. Its hops after the publisher are stamped by the --tap
    /// children; the pipeline itself is started and stopped outside the soak.
    #[arg(long, value_name = "FILE")]
    pub pipeline: Option<PathBuf>,
    /// With --pipeline: a `hoptrace tap` to run for the soak, as its arguments in one
    /// string (repeatable), e.g. `--tap "--from mqtt://127.0.0.1:1883?version=5 --topics
    /// t/# --hop broker"` or `--tap "--from influxdb://127.0.0.1:8086/db?measurement=m"`.
    /// The soak adds --collector, --pipeline and --publishers.
    #[arg(
        long = "tap",
        value_name = "ARGS",
        requires = "pipeline",
        allow_hyphen_values = true
    )]
    pub taps: Vec<String>,
    /// With --pipeline: sample the CPU and RSS of the process listening on this TCP port
    /// (repeatable; the broker's is always sampled).
    #[arg(long = "watch-port", value_name = "PORT", requires = "pipeline")]
    pub watch_ports: Vec<u16>,
    /// First MQTT topic level of the published topics (default: `hoptrace-soak/<run id>`;
    /// with --pipeline, the topic of the --broker address).
    #[arg(long)]
    pub topic_root: Option<String>,
    /// Also put the trace context in the JSON payload's `hoptrace` field, for pipelines
    /// that keep payload fields but drop MQTT user properties or Kafka headers.
    #[arg(long)]
    pub payload_context: bool,
}

impl ExternalArgs {
    /// The external pipeline these options describe (`None`: the reference pipeline).
    ///
    /// # Errors
    /// A `--tap` with an unclosed quote.
    pub fn external(&self) -> anyhow::Result<Option<External>> {
        let Some(pipeline) = &self.pipeline else {
            return Ok(None);
        };
        Ok(Some(External {
            pipeline: pipeline.clone(),
            taps: self
                .taps
                .iter()
                .map(|t| soak::split_args(t).context("--tap"))
                .collect::<anyhow::Result<_>>()?,
            watch_ports: self.watch_ports.clone(),
        }))
    }

    /// These options again as `hoptrace soak` flags, for the soaks a sweep runs.
    #[must_use]
    pub fn soak_flags(&self) -> Vec<std::ffi::OsString> {
        let mut a: Vec<std::ffi::OsString> = Vec::new();
        if let Some(p) = &self.pipeline {
            a.extend(["--pipeline".into(), p.clone().into_os_string()]);
        }
        for t in &self.taps {
            a.extend(["--tap".into(), t.into()]);
        }
        for port in &self.watch_ports {
            a.extend(["--watch-port".into(), port.to_string().into()]);
        }
        if let Some(root) = &self.topic_root {
            a.extend(["--topic-root".into(), root.into()]);
        }
        if self.payload_context {
            a.push("--payload-context".into());
        }
        a
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
    for e in &measured.exited {
        eprintln!("warning: a sampled process died during the run: {e}");
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
            t.verdict()
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
    let missed: Vec<&str> = o
        .result
        .targets
        .iter()
        .filter(|t| t.missed())
        .map(|t| t.name.as_str())
        .collect();
    if !missed.is_empty() {
        return Err(crate::errors::exit_with(
            SOAK_TARGET_MISSED,
            anyhow::anyhow!(
                "{} target(s) missed: {} (the run and its report are written: see the Soak section)",
                missed.len(),
                missed.join("; ")
            ),
        ));
    }
    Ok(())
}

pub use hoptrace_runner::soak::EXIT_TARGET_MISSED as SOAK_TARGET_MISSED;

use crate::clock::Preflight as _;

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
            topic_root: Some("hoptrace-soak/s1".into()),
            publisher_json: "out/publisher.json".into(),
            publisher_id: 77,
        };
        let at = Addresses {
            collector: "127.0.0.1:7401".into(),
            metrics: "127.0.0.1:7402".parse().unwrap(),
            store: "127.0.0.1:7403".into(),
            ui: Some("127.0.0.1:7404".into()),
        };
        let cmds = PartCommands::new(&opts, &plan, &at, true).unwrap();
        let Command::Collect(c) = parse(&cmds.collector) else {
            unreachable!("collect")
        };
        assert_eq!(c.listen.as_deref(), Some("127.0.0.1:7401"));
        assert_eq!(c.metrics.as_deref(), Some("127.0.0.1:7402"));
        // The live view, with the soak's rate as its target.
        assert_eq!(c.ui.as_deref(), Some("127.0.0.1:7404"));
        assert_eq!(c.target_rate, Some(opts.rate as f64));
        assert_eq!(c.run_id.as_deref(), Some("s1"));
        assert_eq!(c.runs, opts.runs);
        assert_eq!(c.preflight.max_clock_error, Some(1_000_000));
        assert!(c.preflight.force_clock);
        assert!(cmds.taps.is_empty());
        let Command::Refpipe(crate::refpipe_cmd::Which::Store(s)) =
            parse(cmds.store.as_ref().unwrap())
        else {
            unreachable!("refpipe store")
        };
        assert_eq!(s.listen, "127.0.0.1:7403");
        assert_eq!(s.collector.collector.as_deref(), Some("127.0.0.1:7401"));
        let Command::Refpipe(crate::refpipe_cmd::Which::Processor(p)) =
            parse(cmds.processor.as_ref().unwrap())
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
        assert_eq!(p.publisher_id, Some(77));
        assert!(!p.payload_context);
    }

    /// A topic path in the broker's address is a prefix of every part's topics: the
    /// processor subscribes under it, where the publisher publishes.
    #[test]
    fn the_address_path_is_every_parts_topic_prefix() {
        let Command::Soak(args) = Cli::parse_from([
            "hoptrace",
            "soak",
            "--broker",
            "mqtt://127.0.0.1:11883/hoptrace/soak1m",
            "--rate",
            "1M",
            "--metrics-per-message",
            "100",
        ])
        .command
        else {
            unreachable!("a soak")
        };
        let opts = args.options().unwrap();
        let plan = Plan {
            run_id: "s3".into(),
            run_dir: "runs/s3".into(),
            out: "out".into(),
            logs: "out/logs".into(),
            topic_root: Some("hoptrace-soak/s3".into()),
            publisher_json: "out/publisher.json".into(),
            publisher_id: 5,
        };
        let at = Addresses {
            collector: "127.0.0.1:7401".into(),
            metrics: "127.0.0.1:7402".parse().unwrap(),
            store: "127.0.0.1:7403".into(),
            ui: None,
        };
        let cmds = PartCommands::new(&opts, &plan, &at, true).unwrap();
        let Command::Refpipe(crate::refpipe_cmd::Which::Processor(p)) =
            parse(cmds.processor.as_ref().unwrap())
        else {
            unreachable!("refpipe processor")
        };
        assert_eq!(p.topics, ["hoptrace/soak1m/hoptrace-soak/s3/#"]);
        let Command::Publish(p) = parse(&cmds.publisher) else {
            unreachable!("publish")
        };
        // The publisher's topics: the address's prefix, then the root.
        let prefix = match hoptrace_broker::url::Endpoint::parse(&p.to).unwrap() {
            hoptrace_broker::url::Endpoint::Mqtt(m) => m.prefix,
            hoptrace_broker::url::Endpoint::Kafka(_) => None,
        };
        assert_eq!(prefix.as_deref(), Some("hoptrace/soak1m"));
        assert_eq!(p.topic_root.as_deref(), Some("hoptrace-soak/s3"));
    }

    /// An external pipeline: no reference processor or store; the taps as given plus
    /// the collector, the spec and the publisher id; the publisher with the spec, the
    /// payload context and the address's topic.
    #[test]
    fn an_external_pipeline_soak_runs_its_taps_with_flags_they_take() {
        let Command::Soak(args) = Cli::parse_from([
            "hoptrace",
            "soak",
            "--broker",
            "mqtt://127.0.0.1:11883/hoptrace/nr/in/soak?version=5",
            "--pipeline",
            "tap/testdata/nodered-influxdb.toml",
            "--tap",
            "--from mqtt://127.0.0.1:11883?version=5 --topics 'hoptrace/nr/in/#' --hop broker",
            "--tap",
            "--from influxdb://127.0.0.1:18086/hoptrace?measurement=nodered --poll-interval 20ms",
            "--watch-port",
            "11880",
            "--payload-context",
        ])
        .command
        else {
            unreachable!("a soak")
        };
        let opts = args.options().unwrap();
        let x = opts.external.as_ref().unwrap();
        assert_eq!(x.watch_ports, [11880]);
        assert_eq!(x.taps[0][3], "hoptrace/nr/in/#");
        let plan = Plan {
            run_id: "s2".into(),
            run_dir: "runs/s2".into(),
            out: "out".into(),
            logs: "out/logs".into(),
            topic_root: None,
            publisher_json: "out/publisher.json".into(),
            publisher_id: 9,
        };
        let at = Addresses {
            collector: "127.0.0.1:7401".into(),
            metrics: "127.0.0.1:7402".parse().unwrap(),
            store: "127.0.0.1:7403".into(),
            ui: None,
        };
        let cmds = PartCommands::new(&opts, &plan, &at, true).unwrap();
        assert!(cmds.store.is_none() && cmds.processor.is_none());
        let spec = std::path::PathBuf::from("tap/testdata/nodered-influxdb.toml");
        let Command::Collect(c) = parse(&cmds.collector) else {
            unreachable!("collect")
        };
        assert_eq!(c.pipeline.as_ref(), Some(&spec));
        assert_eq!(cmds.taps.len(), 2);
        let Command::Tap(t) = parse(&cmds.taps[0]) else {
            unreachable!("tap")
        };
        assert_eq!(t.from, "mqtt://127.0.0.1:11883?version=5");
        assert_eq!(
            (t.topics.as_slice(), t.hop.as_str()),
            (&["hoptrace/nr/in/#".to_owned()][..], "broker")
        );
        assert_eq!(t.publishers, [9]);
        assert_eq!(t.collector.collector.as_deref(), Some("127.0.0.1:7401"));
        assert_eq!(t.hop_spec.pipeline.as_ref(), Some(&spec));
        let Command::Tap(t) = parse(&cmds.taps[1]) else {
            unreachable!("tap")
        };
        assert_eq!(
            t.from,
            "influxdb://127.0.0.1:18086/hoptrace?measurement=nodered"
        );
        assert_eq!(t.store.poll_interval, std::time::Duration::from_millis(20));
        let Command::Publish(p) = parse(&cmds.publisher) else {
            unreachable!("publish")
        };
        assert_eq!(p.to, "mqtt://127.0.0.1:11883/hoptrace/nr/in/soak?version=5");
        assert_eq!(p.topic_root, None);
        assert!(p.payload_context);
        assert_eq!(p.publisher_id, Some(9));
        assert_eq!(p.hop_spec.pipeline.as_ref(), Some(&spec));
    }

    #[test]
    fn an_external_pipeline_soak_refuses_taps_that_cannot_work() {
        let soak = |extra: &[&str]| {
            let line = ["hoptrace", "soak", "--broker", "mqtt://127.0.0.1:11883"]
                .iter()
                .chain(extra);
            let Command::Soak(args) = Cli::try_parse_from(line)?.command else {
                unreachable!("a soak")
            };
            Ok::<_, clap::Error>(args.options().and_then(|o| o.check().map(|_| ())))
        };
        let spec = "tap/testdata/nodered-influxdb.toml";
        // A tap without a pipeline spec is refused by the command line.
        assert!(soak(&["--tap", "--from mqtt://h:1"]).is_err());
        let e = soak(&["--pipeline", spec])
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least one --tap"), "{e}");
        let e = soak(&["--pipeline", spec, "--tap", "--hop broker"])
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(e.contains("no --from"), "{e}");
        let e = soak(&[
            "--pipeline",
            spec,
            "--tap",
            "--from mqtt://h:1 --collector 1.2.3.4:5",
        ])
        .unwrap()
        .unwrap_err()
        .to_string();
        assert!(e.contains("--collector is the soak's to set"), "{e}");
        let e = soak(&["--pipeline", spec, "--tap", "--from 'mqtt://h:1"])
            .unwrap()
            .unwrap_err();
        assert!(format!("{e:#}").contains("unclosed '"), "{e:#}");
        let e = soak(&["--pipeline", "no/such.toml", "--tap", "--from mqtt://h:1"])
            .unwrap()
            .unwrap_err();
        assert!(format!("{e:#}").contains("no/such.toml"), "{e:#}");
    }
}
