//! The options of `hoptrace refpipe store|processor`.

use std::time::Duration;

use hoptrace_format::units;

use crate::collector::CollectorArgs;

/// Options of `hoptrace refpipe store`.
#[derive(Debug, clap::Args)]
pub struct StoreArgs {
    /// Address to serve writes and queries on.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:7500", value_parser = crate::units::parse_listen)]
    pub listen: String,
    #[command(flatten)]
    pub collector: CollectorArgs,
}

/// Options of `hoptrace refpipe processor`.
#[derive(Debug, clap::Args)]
pub struct ProcessorArgs {
    /// Broker: `mqtt://host:port` or `kafka://host:port/topic`.
    #[arg(long)]
    pub from: String,
    /// MQTT topic filters or Kafka topics, comma-separated (default: `#`, or the
    /// address's Kafka topics).
    #[arg(long, value_delimiter = ',')]
    pub topics: Vec<String>,
    /// The store's address.
    #[arg(long, default_value = "127.0.0.1:7500")]
    pub store: String,
    /// A batch is written once it holds this many rows...
    #[arg(long, default_value_t = 2000)]
    pub batch_rows: usize,
    /// ...or once its first row has waited this long (a unit is needed: `1ms`, `500us`).
    #[arg(long, default_value = "1ms", value_parser = units::parse_short_duration)]
    pub linger: Duration,
    #[command(flatten)]
    pub collector: CollectorArgs,
}
