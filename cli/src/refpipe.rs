//! The options of `hoptrace refpipe store|processor`.

use std::time::Duration;

use hoptrace_format::units;

use crate::collector::CollectorArgs;

use crate::argv::{Argv, ToArgs};

/// Options of `hoptrace refpipe store`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct StoreArgs {
    /// Address to serve writes and queries on.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:7500", value_parser = crate::units::parse_listen)]
    pub listen: String,
    #[command(flatten)]
    pub collector: CollectorArgs,
}

/// Options of `hoptrace refpipe processor`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
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

impl ToArgs for StoreArgs {
    fn write_args(&self, argv: &mut Argv) {
        let Self { listen, collector } = self;
        argv.value("--listen", listen);
        argv.group(collector);
    }
}

impl ToArgs for ProcessorArgs {
    fn write_args(&self, argv: &mut Argv) {
        let Self {
            from,
            topics,
            store,
            batch_rows,
            linger,
            collector,
        } = self;
        argv.value("--from", from);
        argv.each("--topics", topics);
        argv.value("--store", store);
        argv.value("--batch-rows", batch_rows.to_string());
        argv.duration("--linger", *linger);
        argv.group(collector);
    }
}

/// Which part.
#[derive(Debug, clap::Subcommand)]
pub enum Which {
    /// The store: takes writes over TCP, answers queries, probes at ingress, visibility
    /// and per query.
    Store(StoreArgs),
    /// The processor: consumes MQTT or Kafka, decodes, batches, transforms and writes to
    /// the store; probes at ingress and egress.
    Processor(ProcessorArgs),
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;
    use crate::argv::parse;
    use crate::collector::every_collector_option;

    #[test]
    fn a_store_s_options_read_back_as_written() {
        let a = StoreArgs {
            listen: "127.0.0.1:7999".into(),
            collector: every_collector_option(),
        };
        assert_eq!(parse::<StoreArgs>(a.to_args(&[])).unwrap(), a);
    }

    #[test]
    fn a_processor_s_options_read_back_as_written() {
        let a = ProcessorArgs {
            from: "mqtt://127.0.0.1:1883?qos=1".into(),
            topics: vec!["plant/#".into(), "line/+/x".into()],
            store: "127.0.0.1:7998".into(),
            batch_rows: 17,
            linger: Duration::from_micros(1_250),
            collector: every_collector_option(),
        };
        assert_eq!(parse::<ProcessorArgs>(a.to_args(&[])).unwrap(), a);
    }

    #[test]
    fn the_subcommand_words_come_first() {
        let a = parse::<StoreArgs>(["--listen", "127.0.0.1:7999"]).unwrap();
        let args = a.to_args(&["refpipe", "store"]);
        assert_eq!(
            args[..3],
            ["refpipe", "store", "--listen"].map(OsString::from)
        );
    }
}
