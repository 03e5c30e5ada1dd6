//! The options of `hoptrace relay`.

use std::path::PathBuf;
use std::time::Duration;

use crate::units::parse_listen;

/// Options of `hoptrace relay`.
#[derive(Debug, clap::Args)]
pub struct RelayArgs {
    /// Address probes connect to (as they would to a collector). Any non-loopback
    /// address requires --token.
    #[arg(long, value_name = "HOST:PORT", default_value = crate::collect::DEFAULT_LISTEN, value_parser = parse_listen)]
    pub listen: String,
    /// Where records go: kafka://HOST:PORT[,HOST:PORT...]/TOPIC (probe control messages
    /// go to TOPIC.control); `?rdkafka.NAME=VALUE&...` sets librdkafka properties on the
    /// relay's producer.
    #[arg(long, value_name = "KAFKA_URL")]
    pub to: String,
    /// Pipeline spec (TOML): the hops probes may report. Default: the built-in pipeline.
    #[arg(long)]
    pub pipeline: Option<PathBuf>,
    /// Partitions of the records topic, when the relay creates it.
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// Replication factor of the topics, when the relay creates them.
    #[arg(long, default_value_t = 1)]
    pub replication: i32,
    #[command(flatten)]
    pub listener: crate::collector::ListenerArgs,
    /// Run id told to probes.
    #[arg(long, default_value = "relay")]
    pub run_id: String,
    /// Stop by itself after this long (`90s`, `30m`; a bare number is seconds); default:
    /// until SIGINT/SIGTERM.
    #[arg(long, alias = "duration-s", value_name = "DURATION", value_parser = crate::units::parse_run_length)]
    pub duration: Option<Duration>,
}
