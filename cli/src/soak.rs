//! The options of `hoptrace soak` and `hoptrace sweep`, and the soak's options written
//! back as arguments: a sweep starts each of its cells as a `hoptrace soak` child.

use std::path::PathBuf;
use std::time::Duration;

use hoptrace_format::units;

use crate::argv::{Argv, ToArgs};
use crate::preflight::PreflightArgs;

/// Options of `hoptrace soak`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
#[command(
    after_help = "Exit status: 0 every target met; 3 the run was measured and reported but a \
target was missed (the line names it); 1 any other failure (options, a part that does not \
start or fails, a report that cannot be written)."
)]
pub struct SoakArgs {
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
    pub preflight: PreflightArgs,
    /// Serve the collector's live view at http://HOST:PORT/ while the soak runs
    /// (`hoptrace collect --ui`), with --rate as its target; `:0` picks a free port.
    #[arg(long, value_name = "HOST:PORT", value_parser = crate::units::parse_listen)]
    pub ui: Option<String>,
}

/// How a soak (or every cell of a sweep) runs against an external pipeline.
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
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

/// Options of `hoptrace sweep`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit status: 0 the sweep ran (cells that do not hold are findings, in the \
report); 3 a cell's counts do not add up (named); 1 any other failure."
)]
pub struct SweepArgs {
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
    pub external: ExternalArgs,
}

impl ToArgs for SoakArgs {
    fn write_args(&self, argv: &mut Argv) {
        let Self {
            broker,
            rate,
            duration,
            metrics_per_message,
            streams,
            zipf,
            batch_rows,
            linger,
            tick,
            warmup,
            runs,
            out,
            run_id,
            external,
            preflight,
            ui,
        } = self;
        argv.value("--broker", broker);
        argv.value("--rate", rate.to_string());
        argv.duration("--duration", *duration);
        argv.value("--metrics-per-message", metrics_per_message.to_string());
        argv.value("--streams", streams.to_string());
        argv.value("--zipf", zipf.to_string());
        argv.value("--batch-rows", batch_rows.to_string());
        argv.duration("--linger", *linger);
        argv.duration("--tick", *tick);
        argv.duration("--warmup", *warmup);
        argv.path("--runs", Some(runs));
        argv.path("--out", out.as_deref());
        argv.opt("--run-id", run_id.as_deref());
        argv.group(external);
        argv.group(preflight);
        argv.opt("--ui", ui.as_deref());
    }
}

impl ToArgs for ExternalArgs {
    fn write_args(&self, argv: &mut Argv) {
        let Self {
            pipeline,
            taps,
            watch_ports,
            topic_root,
            payload_context,
        } = self;
        argv.path("--pipeline", pipeline.as_deref());
        argv.each("--tap", taps);
        argv.each("--watch-port", watch_ports);
        argv.opt("--topic-root", topic_root.as_deref());
        argv.flag("--payload-context", *payload_context);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argv::parse;

    #[test]
    fn a_soak_with_every_option_set_is_written_back_as_itself() {
        let soak = SoakArgs {
            broker: "mqtt://127.0.0.1:1883/plant".into(),
            rate: 20_000,
            duration: Duration::from_millis(90_500),
            metrics_per_message: 7,
            streams: 33,
            zipf: 1.1,
            batch_rows: 123,
            linger: Duration::from_micros(1_500),
            tick: Duration::from_micros(250),
            warmup: Duration::from_secs(3),
            runs: "some/runs".into(),
            out: Some("some/out".into()),
            run_id: Some("s-1".into()),
            external: ExternalArgs {
                pipeline: Some("nodered.toml".into()),
                taps: vec![
                    "--from mqtt://127.0.0.1:1883 --hop broker".into(),
                    "--from 'influxdb://127.0.0.1:8086/db?measurement=m'".into(),
                ],
                watch_ports: vec![1880, 8086],
                topic_root: Some("plant/a".into()),
                payload_context: true,
            },
            preflight: PreflightArgs {
                max_clock_error: Some(1_000_000),
                force_clock: true,
            },
            ui: Some("127.0.0.1:0".into()),
        };
        let back: SoakArgs = parse(soak.to_args(&[])).unwrap();
        assert_eq!(back, soak);
    }

    #[test]
    fn a_soak_of_defaults_is_written_back_as_itself() {
        let soak: SoakArgs = parse(["--broker", "kafka://127.0.0.1:9092/t"]).unwrap();
        assert_eq!(parse::<SoakArgs>(soak.to_args(&[])).unwrap(), soak);
    }
}
